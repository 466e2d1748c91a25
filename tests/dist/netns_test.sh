#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair, one rank in each.
# Rank 0 hosts the TCP store on its side of the link; the rendezvous, Gloo's connections and
# every all_reduce case go over that link, and the test checks that Gloo listened on the link's
# addresses (not on loopback).
#   bash tests/dist/netns_test.sh BUILD/bin/bp_dist_rank
# Exit 77 (reported as skipped by ctest) with the reason when namespaces cannot be made here
# (not root, no CAP_SYS_ADMIN, no iproute2).
set -u
rank_bin=${1:?usage: netns_test.sh path/to/bp_dist_rank}
id=bpns$$
ns_a=${id}a
ns_b=${id}b
work=$(mktemp -d)
cleanup() {
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

if ! command -v ip >/dev/null; then
  echo "SKIP: iproute2's ip is not installed (tools/setup.sh installs it)"
  exit 77
fi
if ! ip netns add "$ns_a" 2>"$work/err"; then
  echo "SKIP: cannot create network namespaces here: $(cat "$work/err") (needs root or CAP_SYS_ADMIN)"
  exit 77
fi
set -e
ip netns add "$ns_b"
ip link add "${id}x" type veth peer name "${id}y"
ip link set "${id}x" netns "$ns_a"
ip link set "${id}y" netns "$ns_b"
ip -n "$ns_a" addr add 10.213.7.1/24 dev "${id}x"
ip -n "$ns_b" addr add 10.213.7.2/24 dev "${id}y"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "${id}x" up
ip -n "$ns_b" link set "${id}y" up
set +e
echo "namespaces $ns_a (10.213.7.1) and $ns_b (10.213.7.2) joined by a veth pair"

# A fresh namespace has no other listeners: a fixed port cannot collide.
common=(BACKPLANE_INIT=tcp://10.213.7.1:29400 BACKPLANE_WORLD_SIZE=2 BACKPLANE_DIST_TIMEOUT=60
        BACKPLANE_DIST_DEBUG=1 BACKPLANE_STORE_SECRET="$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')")
ip netns exec "$ns_a" env "${common[@]}" BACKPLANE_RANK=0 "$rank_bin" collectives \
  --only all_reduce >"$work/rank0" 2>&1 &
pid_a=$!
ip netns exec "$ns_b" env "${common[@]}" BACKPLANE_RANK=1 "$rank_bin" collectives \
  --only all_reduce >"$work/rank1" 2>&1 &
pid_b=$!
wait "$pid_a"
status_a=$?
wait "$pid_b"
status_b=$?
for r in 0 1; do sed "s/^/[rank $r] /" "$work/rank$r"; done

fail=0
[ "$status_a" = 0 ] || { echo "FAIL: rank 0 exited with $status_a"; fail=1; }
[ "$status_b" = 0 ] || { echo "FAIL: rank 1 exited with $status_b"; fail=1; }
grep -q "addr=\[10.213.7.1\]" "$work/rank0" || { echo "FAIL: rank 0's Gloo did not listen on 10.213.7.1"; fail=1; }
grep -q "addr=\[10.213.7.2\]" "$work/rank1" || { echo "FAIL: rank 1's Gloo did not listen on 10.213.7.2"; fail=1; }
for r in 0 1; do
  grep -q "rank $r: collectives: [0-9]* checks passed, 0 failed" "$work/rank$r" ||
    { echo "FAIL: rank $r did not pass its checks"; fail=1; }
done
[ "$fail" = 0 ] && echo "PASS: rendezvous and all_reduce across two network namespaces"
exit "$fail"
