#!/usr/bin/env bash
# loadgen with the database a real network hop away: loadgen (and the
# pgbench it starts for `vs_floor`) runs in a network namespace of its own,
# reaching the host's server over a veth pair, each direction delayed by
# half of DELAY µs with `tc netem` where the kernel has it. Unlike
# `--added-rtt-us`, no proxy in loadgen's process holds the bytes: the
# packets cross the kernel's stack twice, as between two hosts.
#
#   bench/netns/run.sh [SECONDS] [ROUNDS]      # defaults: 350 s, 5 rounds (10 s slices for dedup on PostgreSQL)
#
# Environment: STORE (postgres | mysql), CLIENTS (16), DELAYS ("0 500": one
# loadgen run per added round trip, in µs), SCENARIO (dedup), LOADGEN (the
# binary; default target/release/loadgen, built beforehand:
# `cargo build --release -p idem-bench`). Root only (namespaces, links).
# Run it as any benchmark here: `flock /tmp/idem-bench.lock bench/netns/run.sh`.
#
# The servers listen on 127.0.0.1 only, which no other namespace reaches: a
# `socat` on the host, bound to the host's end of the pair, forwards each
# connection to 127.0.0.1 (a copy in user space on the host, paid alike by
# every mode and by pgbench). Addresses: link-local 169.254.77.1 (host) and
# 169.254.77.2 (namespace), on these two links only. Everything is removed
# on exit, interrupted or not; every run is bounded by `timeout`.
set -euo pipefail

seconds=${1:-350}
rounds=${2:-5}
store=${STORE:-postgres}
clients=${CLIENTS:-16}
read -r -a delays <<< "${DELAYS:-0 500}"
scenario=${SCENARIO:-dedup}
dir=$(cd "$(dirname "$0")" && pwd)
loadgen=${LOADGEN:-$dir/../../target/release/loadgen}

ns=idem-bench-ns
host_if=idem-bench-h
ns_if=idem-bench-n
host_addr=169.254.77.1
ns_addr=169.254.77.2

case $store in
    postgres) port=5432 url="postgres://postgres@$host_addr:$port/test" ;;
    mysql) port=3306 url="mysql://root@$host_addr:$port/test" ;;
    *)
        echo "STORE is postgres or mysql, not $store" >&2
        exit 1
        ;;
esac
if [[ ! -x $loadgen ]]; then
    echo "no loadgen at $loadgen: cargo build --release -p idem-bench (or LOADGEN=...)" >&2
    exit 1
fi
for tool in ip tc socat timeout; do
    command -v "$tool" > /dev/null || {
        echo "$tool is missing" >&2
        exit 1
    }
done
if ip netns list | grep -qw "$ns" || ip link show "$host_if" > /dev/null 2>&1; then
    echo "$ns or $host_if exists already (another run, or one that could not clean up): not touching it" >&2
    exit 1
fi

socat_pid='' loadgen_pid='' out=''
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
    set +e
    # An interrupted run: loadgen (under `timeout`, which passes the signal on) first.
    if [[ -n $loadgen_pid ]]; then
        kill "$loadgen_pid" 2> /dev/null
        wait "$loadgen_pid" 2> /dev/null
    fi
    [[ -n $out ]] && rm -f "$out"
    if [[ -n $socat_pid ]]; then
        # Its children (one per connection) first, by parent id; then it.
        pkill -P "$socat_pid" 2> /dev/null
        kill "$socat_pid" 2> /dev/null
        wait "$socat_pid" 2> /dev/null
    fi
    # Deleting the namespace deletes its end of the pair, and with it the host's.
    ip netns del "$ns" 2> /dev/null
    ip link del "$host_if" 2> /dev/null
    if ip netns list | grep -qw "$ns" || ip link show "$host_if" > /dev/null 2>&1; then
        echo "netns: could not remove $ns / $host_if" >&2
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$ns"
ip link add "$host_if" type veth peer name "$ns_if" netns "$ns"
ip addr add "$host_addr/30" dev "$host_if"
ip link set "$host_if" up
ip -n "$ns" addr add "$ns_addr/30" dev "$ns_if"
ip -n "$ns" link set "$ns_if" up
ip -n "$ns" link set lo up

socat "TCP-LISTEN:$port,bind=$host_addr,reuseaddr,fork,nodelay,backlog=128" "TCP:127.0.0.1:$port,nodelay" &
socat_pid=$!
for _ in $(seq 50); do
    if timeout 1 ip netns exec "$ns" bash -c "echo > /dev/tcp/$host_addr/$port" 2> /dev/null; then
        break
    fi
    sleep 0.1
done

# The added delay: half each way, on both ends of the pair. Prints why not
# (and returns 1) where netem is missing.
set_delay() {
    local us=$1 out
    tc qdisc del dev "$host_if" root 2> /dev/null || true
    tc -n "$ns" qdisc del dev "$ns_if" root 2> /dev/null || true
    ((us == 0)) && return 0
    if ! out=$(tc qdisc add dev "$host_if" root netem delay "$((us / 2))us" 2>&1) ||
        ! out=$(tc -n "$ns" qdisc add dev "$ns_if" root netem delay "$((us - us / 2))us" 2>&1); then
        echo "netns: no delay of $us us: \`tc qdisc add dev $host_if root netem delay $((us / 2))us\`: $out" >&2
        return 1
    fi
}

# What one round trip costs through the hop against loopback: a `SELECT 1`
# from one client (PostgreSQL, pgbench's average latency, 2 s each).
hop_latency() {
    if [[ $store != postgres ]] || ! command -v pgbench > /dev/null; then
        return 0
    fi
    local script direct hop
    script=$(mktemp)
    echo 'SELECT 1;' > "$script"
    direct=$(timeout 30 pgbench -n -M simple -c 1 -T 2 -f "$script" "postgres://postgres@127.0.0.1:$port/test" 2>&1 |
        sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p')
    hop=$(timeout 30 ip netns exec "$ns" pgbench -n -M simple -c 1 -T 2 -f "$script" "$url" 2>&1 |
        sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p')
    rm -f "$script"
    echo "netns select1_latency_ms: loopback=${direct:-na} hop=${hop:-na}"
}

status=0
out=$(mktemp)
for us in "${delays[@]}"; do
    if ! set_delay "$us"; then
        echo "netns delay_us=$us skipped=netem_unavailable"
        status=2
        continue
    fi
    echo "netns delay_us=$us store=$store clients=$clients seconds=$seconds rounds=$rounds load: $(cut -d' ' -f1-3 /proc/loadavg)"
    hop_latency
    # In the background, so that a signal runs the trap now, not when loadgen is done.
    timeout "$((seconds * 2 + 120))" ip netns exec "$ns" "$loadgen" --scenario "$scenario" --database-url "$url" \
        --clients "$clients" --seconds "$seconds" --rounds "$rounds" > "$out" 2>&1 &
    loadgen_pid=$!
    if ! wait "$loadgen_pid"; then
        echo "netns: loadgen failed at delay_us=$us" >&2
        status=1
    fi
    loadgen_pid=''
    sed "\$s/\$/ netns_delay_us=$us/" "$out"
done
exit "$status"
