#!/usr/bin/env python3
"""Attacks a live Backplane TCP store (Note [Store limits] in core/src/dist/dist_store.cpp).

    store_attack.py HOST PORT [SEED]

Without the secret: the nine bytes that used to abort the host (GET with 2^32-1 keys), ERASE
with 2^31-1 keys, well-formed SETs of rendezvous keys, a wrong secret, random bytes, and a
connection that never says anything. With the secret (BACKPLANE_STORE_SECRET, as a rank that
went wrong would have it): crafted counts and random bytes, and slow readers that pipeline
64 MiB of replies each and read them only at the end. Exits 0 when the store refused and dropped
every connection it should have, and the slow readers got every reply intact; 1 otherwise.
"""
import os
import random
import socket
import struct
import sys
import time

host, port = sys.argv[1], int(sys.argv[2])
seed = int(sys.argv[3]) if len(sys.argv) > 3 else random.SystemRandom().randrange(1 << 32)
secret = os.environ.get("BACKPLANE_STORE_SECRET", "").encode()
rnd = random.Random(seed)
failures = []
print(f"store_attack: {host}:{port}, seed {seed}", flush=True)


def s(b):
    return struct.pack("<I", len(b)) + b


def conn():
    c = socket.create_connection((host, port), timeout=30)
    return c


def hello(c):
    c.sendall(b"\x08" + s(secret))
    if c.recv(1) != b"\x00":
        failures.append("the store refused the right secret")


def closed(c, what, within=30):
    """True when the server closes `c` (EOF or reset) within `within` seconds."""
    c.settimeout(within)
    try:
        while True:
            b = c.recv(65536)
            if not b:
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        failures.append(f"{what}: the store kept the connection")
        return False


def send(c, b):
    try:
        c.sendall(b)
    except (BrokenPipeError, ConnectionResetError):
        pass


silent = conn()  # never sends a byte: dropped after the handshake time

# Without the secret.
crafted = {
    "GET with 2^32-1 keys": b"\x02" + struct.pack("<I", 1000) + b"\xff\xff\xff\xff",
    "ERASE with 2^31-1 keys": b"\x05\xff\xff\xff\x7f",
    "SET of a claim key": b"\x01" + s(b"bp/g0/rdzv/claim/1") + s(b"1"),
    "SET of an abort key": b"\x01" + s(b"bp/g0/abort") + s(b"x"),
    "ADD to a claim counter": b"\x04" + s(b"bp/g0/rdzv/claims") + struct.pack("<q", 1),
    "a wrong secret": b"\x08" + s(b"0123456789abcdef0123456789abcdef"),
}
for what, b in crafted.items():
    c = conn()
    send(c, b)
    closed(c, "no secret, " + what)
    c.close()
for i in range(50):
    c = conn()
    send(c, bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 4096))))
    c.close()

# With the secret.
if secret:
    for what, b in {
        "GET with 2^32-1 keys": b"\x02" + struct.pack("<I", 1000) + b"\xff\xff\xff\xff",
        "ERASE with 2^31-1 keys": b"\x05\xff\xff\xff\x7f",
        "SET of a 4 GiB key": b"\x01\xf0\xff\xff\xff",
        "an unknown request": b"\x63",
    }.items():
        c = conn()
        hello(c)
        send(c, b)
        closed(c, "with the secret, " + what)
        c.close()
    for i in range(50):
        c = conn()
        hello(c)
        body = bytearray(rnd.getrandbits(8) for _ in range(rnd.randint(1, 4096)))
        body[0] = rnd.choice([2, 5, 9, 200, 0])  # never a SET/ADD that could change real keys
        send(c, bytes(body))
        c.close()
    value = bytes(rnd.getrandbits(8) for _ in range(1 << 20))
    slow = []
    for i in range(4):
        c = conn()
        hello(c)
        key = b"attack/big%d" % i
        c.sendall(b"\x01" + s(key) + s(value))
        if c.recv(1) != b"\x00":
            failures.append("SET of the slow reader's value failed")
        send(c, (b"\x03" + s(key)) * 64)  # 64 MiB of replies, not read yet
        slow.append(c)
    time.sleep(3)  # the group keeps running meanwhile
    want = b"\x01" + s(value)
    for i, c in enumerate(slow):
        c.settimeout(60)
        for k in range(64):
            got = b""
            while len(got) < len(want):
                b = c.recv(len(want) - len(got))
                if not b:
                    break
                got += b
            if got != want:
                failures.append(f"slow reader {i}: reply {k} came broken ({len(got)} bytes)")
                break
        c.close()

closed(silent, "a connection that never sent anything", within=30)
for f in failures:
    print("store_attack: FAILED:", f, flush=True)
print("store_attack: %s" % ("every attack refused" if not failures else "%d failure(s)" % len(failures)),
      flush=True)
sys.exit(1 if failures else 0)
