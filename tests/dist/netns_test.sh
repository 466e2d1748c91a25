#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair, one rank in each.
# Rank 0 hosts the TCP store on its side of the link; the rendezvous, Gloo's connections and
# every all_reduce case go over that link, and the test checks that Gloo listened on the link's
# addresses (not on loopback). The pair is started once per launcher, with only that launcher's
# variables set by hand (Note [Launchers] in dist_launch.hpp): bp-run's, torchrun's, Slurm's
# (the store's host from SLURM_JOB_NODELIST, resolved through each namespace's /etc/hosts, on
# the default port), Open MPI's, PMIx's (under srun) and MPICH's.
#   bash tests/dist/netns_test.sh BUILD/bin/bp_dist_rank
# Exit 77 (reported as skipped by ctest) with the reason when namespaces cannot be made here
# (not root, no CAP_SYS_ADMIN, no iproute2).
set -u
set -f  # no pathname expansion: the node lists hold brackets
rank_bin=${1:?usage: netns_test.sh path/to/bp_dist_rank}
id=bpns$$
ns_a=${id}a
ns_b=${id}b
work=$(mktemp -d)
cleanup() {
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  rm -rf "$work" "/etc/netns/$ns_a" "/etc/netns/$ns_b"
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

# `ip netns exec` mounts /etc/netns/<ns>/hosts over /etc/hosts: the Slurm node names. Where
# /etc is read-only the node list names the addresses instead ("10.213.7.[1-2]" is a list too).
nodes='bpnode-[01-02]' node0=bpnode-01
for ns in "$ns_a" "$ns_b"; do
  if ! { mkdir -p "/etc/netns/$ns" &&
         printf '127.0.0.1 localhost\n10.213.7.1 bpnode-01\n10.213.7.2 bpnode-02\n' \
           >"/etc/netns/$ns/hosts"; } 2>/dev/null; then
    nodes='10.213.7.[1-2]' node0=10.213.7.1
    echo "note: /etc/netns is not writable; the Slurm node list names addresses"
  fi
done

secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
fail=0
# run_pair NAME LAUNCHER "RANK0 VARIABLES" "RANK1 VARIABLES" "COMMON VARIABLES": a clean
# environment (no variable of another launcher leaks in from the caller's) in each namespace.
run_pair() {
  local name=$1 launcher=$2 vars0=$3 vars1=$4 common=$5
  local base=(env -i PATH="$PATH" HOME="${HOME:-/root}" BACKPLANE_DIST_TIMEOUT=60
              BACKPLANE_DIST_DEBUG=1 BACKPLANE_STORE_SECRET="$secret")
  # shellcheck disable=SC2086
  ip netns exec "$ns_a" "${base[@]}" $common $vars0 "$rank_bin" collectives --only all_reduce \
    >"$work/$name.0" 2>&1 &
  local pid_a=$!
  # shellcheck disable=SC2086
  ip netns exec "$ns_b" "${base[@]}" $common $vars1 "$rank_bin" collectives --only all_reduce \
    >"$work/$name.1" 2>&1 &
  local pid_b=$!
  wait "$pid_a"
  local status_a=$?
  wait "$pid_b"
  local status_b=$?
  for r in 0 1; do sed "s/^/[$name rank $r] /" "$work/$name.$r"; done
  local bad=0
  [ "$status_a" = 0 ] || { echo "FAIL ($name): rank 0 exited with $status_a"; bad=1; }
  [ "$status_b" = 0 ] || { echo "FAIL ($name): rank 1 exited with $status_b"; bad=1; }
  grep -q "addr=\[10.213.7.1\]" "$work/$name.0" ||
    { echo "FAIL ($name): rank 0's Gloo did not listen on 10.213.7.1"; bad=1; }
  grep -q "addr=\[10.213.7.2\]" "$work/$name.1" ||
    { echo "FAIL ($name): rank 1's Gloo did not listen on 10.213.7.2"; bad=1; }
  for r in 0 1; do
    grep -q "rank $r: collectives: [0-9]* checks passed, 0 failed" "$work/$name.$r" ||
      { echo "FAIL ($name): rank $r did not pass its checks"; bad=1; }
    grep -q "joined: rank $r of 2 through .*($launcher: " "$work/$name.$r" ||
      { echo "FAIL ($name): rank $r did not take its rank from $launcher's variables"; bad=1; }
  done
  [ "$bad" = 0 ] && echo "PASS ($name): rendezvous and all_reduce across two namespaces"
  [ "$bad" = 0 ] || fail=1
}

# A fresh namespace has no other listeners: fixed ports cannot collide.
run_pair backplane bp-run "BACKPLANE_RANK=0" "BACKPLANE_RANK=1" \
  "BACKPLANE_INIT=tcp://10.213.7.1:29400 BACKPLANE_WORLD_SIZE=2"
run_pair torchrun torchrun "RANK=0 LOCAL_RANK=0" "RANK=1 LOCAL_RANK=0" \
  "WORLD_SIZE=2 MASTER_ADDR=10.213.7.1 MASTER_PORT=29401"
run_pair slurm slurm "SLURM_PROCID=0 SLURM_LOCALID=0" "SLURM_PROCID=1 SLURM_LOCALID=0" \
  "SLURM_NTASKS=2 SLURM_JOB_NODELIST=$nodes SLURM_NODELIST=$nodes"
run_pair openmpi openmpi "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_LOCAL_RANK=0" \
  "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_LOCAL_RANK=0" \
  "OMPI_COMM_WORLD_SIZE=2 MASTER_ADDR=10.213.7.1 MASTER_PORT=29402"
run_pair pmix pmix "PMIX_RANK=0 SLURM_LOCALID=0" "PMIX_RANK=1 SLURM_LOCALID=0" \
  "SLURM_NTASKS=2 MASTER_ADDR=$node0 MASTER_PORT=29403"
run_pair mpich mpich "PMI_RANK=0 MPI_LOCALRANKID=0" "PMI_RANK=1 MPI_LOCALRANKID=0" \
  "PMI_SIZE=2 MASTER_ADDR=10.213.7.1 MASTER_PORT=29404"

# An MPI launcher without an address: the error says what to export.
ip netns exec "$ns_a" env -i PATH="$PATH" OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 \
  "$rank_bin" collectives --only all_reduce >"$work/noaddr" 2>&1
if grep -q "MPI launchers give each rank its rank and size but no rendezvous address" \
  "$work/noaddr"; then
  echo "PASS (openmpi without MASTER_ADDR): the error names the variables to export"
else
  sed "s/^/[noaddr] /" "$work/noaddr"
  echo "FAIL (openmpi without MASTER_ADDR): no error naming MASTER_ADDR"
  fail=1
fi
[ "$fail" = 0 ] && echo "PASS: every launcher's variables across two network namespaces"
exit "$fail"
