#!/bin/sh
# health-floor.sh: builds lb-health-bench's bed (NAPI-thread mode) in namespaces of its own,
# runs health-floor.c's prober in it and removes everything again, also on failure.
# usage: health-floor.sh <floor-binary> <slot|readable> [targets] [seconds]   (as root)
#   PREFIX="perf record -o floor.data --" runs the prober under that command.
set -eu
bin=$1; mode=$2; targets=${3:-50000}; seconds=${4:-10}
c=hfl-c; t=hfl-t
listener=
cleanup() {
    [ -n "$listener" ] && kill "$listener" 2>/dev/null || true
    ip netns del $c 2>/dev/null || true
    ip netns del $t 2>/dev/null || true
}
trap cleanup EXIT INT TERM
ip netns add $c; ip netns add $t
ip link add hfl-c0 netns $c type veth peer name hfl-t0 netns $t
ip -n $c addr add 10.49.0.1/16 dev hfl-c0; ip -n $t addr add 10.49.0.2/16 dev hfl-t0
for ns in $c $t; do
    dev=$([ $ns = $c ] && echo hfl-c0 || echo hfl-t0)
    ip -n $ns link set lo up; ip -n $ns link set $dev up
    # As the test kit's veth: no checksum offload (and so no TSO: with it veth hands the frames
    # to the peer inline, charging the receiver to the sender), GRO on for a NAPI instance.
    ip netns exec $ns ethtool -K $dev tx off gro on >/dev/null
    ip netns exec $ns sh -c "echo 1 > /sys/class/net/$dev/threaded"
    ip netns exec $ns tc qdisc replace dev $dev root pfifo limit 10000
done
ip -n $t route add local 10.50.0.0/16 dev lo
ip -n $c route add 10.50.0.0/16 via 10.49.0.2
# The kernel answers every SYN; nobody accepts.
nsenter --net=/run/netns/$t python3 -c '
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080)); s.listen(4096); time.sleep(3600)' &
listener=$!
mac=$(ip -n $t -o link show hfl-t0 | sed -n 's/.*link\/ether \([0-9a-f:]*\).*/\1/p')
ip -n $c neigh replace 10.49.0.2 lladdr "$mac" dev hfl-c0
sleep 0.5
${PREFIX:-} nsenter --net=/run/netns/$c "$bin" "$mode" hfl-c0 "$mac" 10.49.0.1 "$targets" "$seconds"
