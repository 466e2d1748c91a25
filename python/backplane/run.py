"""python -m backplane.run: starts N local processes of a script as the ranks of one process
group, like torchrun and bp-run.

    python -m backplane.run -n 2 train.py --epochs 3

Note [Python launcher]
  As bp-run does (Note [bp-run rendezvous]): the launcher hosts the group's TCP store on
  127.0.0.1 and a port the kernel picks, and gives every rank BACKPLANE_RANK,
  BACKPLANE_WORLD_SIZE, BACKPLANE_LOCAL_RANK, BACKPLANE_INIT=tcp://127.0.0.1:<port>,
  BACKPLANE_STORE_HOSTED=1 and a fresh BACKPLANE_STORE_SECRET (one from the environment is
  kept). A script (a path ending in .py) runs under this interpreter, anything else as a
  program; `-m module` runs a module. Every line a rank prints is forwarded with a "[rank k] "
  prefix. When a rank fails, the others are stopped (SIGTERM, then SIGKILL after 5 s) with a
  message naming it (with --keep-going they run on, for fault recovery), and the launcher exits
  with the failing rank's status.
"""
import argparse
import os
import signal
import subprocess
import sys
import threading
import time

from . import _core


def _forward(stream, prefix, out, lock):
    for line in iter(stream.readline, b""):
        with lock:
            out.buffer.write(prefix + line)
            out.flush()
    stream.close()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m backplane.run",
                                     description="Starts N ranks of one Backplane process group.")
    parser.add_argument("-n", "--nproc-per-node", "--nproc_per_node", type=int, required=True,
                        dest="n", help="number of processes (ranks)")
    parser.add_argument("-m", "--module", action="store_true",
                        help="run the program as a module (python -m program)")
    parser.add_argument("--keep-going", action="store_true",
                        help="let the other ranks run on when one fails (fault recovery: "
                             "shrink_group); the status is still the first failing rank's")
    parser.add_argument("program")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    a = parser.parse_args(argv)
    if a.n < 1:
        parser.error(f"-n must be at least 1, got {a.n}")
    secret = os.environ.get("BACKPLANE_STORE_SECRET") or _core._generate_store_secret()
    server = _core._TcpStoreServer("127.0.0.1", 0, secret)
    if a.module:
        cmd = [sys.executable, "-m", a.program]
    elif a.program.endswith(".py"):
        cmd = [sys.executable, a.program]
    else:
        cmd = [a.program]
    cmd += a.args
    procs, threads = [], []
    lock = threading.Lock()
    for rank in range(a.n):
        env = dict(os.environ, BACKPLANE_RANK=str(rank), BACKPLANE_WORLD_SIZE=str(a.n),
                   BACKPLANE_LOCAL_RANK=str(rank),
                   BACKPLANE_INIT=f"tcp://127.0.0.1:{server.port}",
                   BACKPLANE_STORE_HOSTED="1", BACKPLANE_STORE_SECRET=secret)
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(p)
        prefix = f"[rank {rank}] ".encode()
        for stream, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
            t = threading.Thread(target=_forward, args=(stream, prefix, out, lock), daemon=True)
            t.start()
            threads.append(t)
    status = 0
    try:
        running = set(range(a.n))
        while running:
            for rank in sorted(running):
                rc = procs[rank].poll()
                if rc is None:
                    continue
                running.discard(rank)
                if rc != 0 and status == 0:
                    status = rc if rc > 0 else 128 - rc
                    others = [r for r in running]
                    if a.keep_going:
                        with lock:
                            sys.stderr.write(f"backplane.run: rank {rank} exited with status "
                                             f"{rc}; ranks {others} go on (--keep-going)\n")
                    elif others:
                        with lock:
                            sys.stderr.write(f"backplane.run: rank {rank} exited with status "
                                             f"{rc}; stopping ranks {others}\n")
                        _stop([procs[r] for r in others])
            time.sleep(0.05)
    except KeyboardInterrupt:
        _stop(procs)
        status = 130
    for t in threads:
        t.join(timeout=5)
    del server
    return status


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
