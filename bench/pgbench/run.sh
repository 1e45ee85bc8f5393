#!/usr/bin/env bash
# pgbench control for loadgen's `dedup` scenario: the same statements, sent by
# pgbench's C client with `-M simple`, the scripts interleaved in rounds (the
# order rotated each round, as loadgen does).
#
#   bench/pgbench/run.sh [ROUNDS] [SECONDS]      # defaults: 5 rounds, 20 s per script
#
# Environment: CLIENTS (16), THREADS (2), WARMUP (seconds per
# script before the first round, 2; 0: none), SCRIPTS ("unguarded guard zero";
# zero_nochain is the fourth), and libpq's PGHOST (127.0.0.1), PGPORT,
# PGUSER (postgres), PGDATABASE (test).
set -euo pipefail

rounds=${1:-5}
seconds=${2:-20}
clients=${CLIENTS:-16}
threads=${THREADS:-2}
warmup=${WARMUP:-2}
read -r -a scripts <<< "${SCRIPTS:-unguarded guard zero}"
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres} PGDATABASE=${PGDATABASE:-test}
dir=$(cd "$(dirname "$0")" && pwd)

if [[ -z $(psql -XAtqc "SELECT to_regclass('idem_records')") ]]; then
    echo "no idem_records table in $PGDATABASE: run loadgen once against it (it migrates)" >&2
    exit 1
fi
PGOPTIONS="-c client_min_messages=warning" psql -Xq -v ON_ERROR_STOP=1 -f "$dir/setup.sql" > /dev/null

stamp=$(date +%s)
# One pgbench run of script $1 for $2 seconds, keys prefixed $3; prints its tps.
one() {
    local script=$1 length=$2 prefix=$3 out
    if ! out=$(pgbench -n -M simple -c "$clients" -j "$threads" -T "$length" \
        -D n=0 -D "kp=$prefix" -f "$dir/$script.sql" 2>&1); then
        echo "pgbench $script failed:" >&2
        echo "$out" >&2
        exit 1
    fi
    if grep -q '^number of failed transactions: [1-9]' <<< "$out"; then
        echo "pgbench $script: failed transactions" >&2
        echo "$out" >&2
        exit 1
    fi
    sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' <<< "$out"
}

if ((warmup > 0)); then
    for i in "${!scripts[@]}"; do
        one "${scripts[$i]}" "$warmup" "P$stamp-w-$i-" > /dev/null
    done
fi

declare -A tps
for ((r = 0; r < rounds; r++)); do
    n=${#scripts[@]}
    for ((j = 0; j < n; j++)); do
        i=$(((j + r) % n))
        s=${scripts[$i]}
        tps[$r,$s]=$(one "$s" "$seconds" "P$stamp-$r-$i-")
    done
    line="round $((r + 1))"
    for s in "${scripts[@]}"; do
        line+=$(printf ' %s=%.0f' "$s" "${tps[$r,$s]}")
    done
    for s in "${scripts[@]}"; do
        [[ $s == unguarded || -z ${tps[$r,unguarded]:-} ]] && continue
        line+=$(awk -v a="${tps[$r,$s]}" -v b="${tps[$r,unguarded]}" -v s="$s" 'BEGIN { printf " %s/unguarded=%.3f", s, a / b }')
    done
    echo "$line"
done

# Medians over rounds of the per-round ratios, as loadgen reports them.
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) printf "%.3f", v[(NR + 1) / 2]; else printf "%.3f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
summary="pgbench clients=$clients threads=$threads seconds=$seconds rounds=$rounds"
for s in "${scripts[@]}"; do
    [[ $s == unguarded ]] && continue
    [[ " ${scripts[*]} " == *" unguarded "* ]] || break
    m=$(for ((r = 0; r < rounds; r++)); do awk -v a="${tps[$r,$s]}" -v b="${tps[$r,unguarded]}" 'BEGIN { print a / b }'; done | median)
    summary+=" ratio_$s=$m"
done
echo "$summary"
