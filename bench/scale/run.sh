#!/usr/bin/env bash
# loadgen's `dedup` scenario on a record table of 10 million records against
# one of 100,000, a purge of the expired half running beside the load, and
# the record table's indexes and fill factor measured (BENCHMARKS.md, R8).
#
#   bench/scale/run.sh [PAIRS] [SECONDS]      # defaults: 3 turns, 30 s per loadgen run
#
# Every table of a run (records, archive, the shop's tables) lives in a
# schema of its own, `idem_bench_scale_<name>`, reached through the
# connection's search_path: the shared `idem_records` is never touched, and
# all schemas are dropped at the end (KEEP=1 keeps them). The records are
# loaded with `INSERT ... SELECT generate_series`, the indexes built after.
#
# Three stages, each PAIRS times with the order rotated, one loadgen run of
# SECONDS (`--rounds ROUNDS`) per table and turn:
#   scale:  small (SMALL records) vs big (RECORDS records, EXPIRED of them expired);
#   purge:  big vs big with `--purge-beside PURGE_BATCH` (purge_expired in
#           batches, PURGE_PAUSE_MS between them) while the rounds run;
#   lean:   small as migrated vs without the expiry index.
# The tables are made by every migration in migrations/postgres, so at
# fillfactor 90 (0003); loadgen's own idem::migrate sets it again at the
# start of each run, so a table at fillfactor 100 cannot be measured with
# it (the lean_big stage that compared 100 and 90 was removed when 0003
# came: see 13c0b36 and BENCHMARKS.md's history).
# STAGES ("scale purge lean") picks stages; each run's last line goes to
# OUT (target/scale-<time>.txt), tagged, and a summary of medians ends it.
#
# Each load and each loadgen run holds the lock LOCK (/tmp/idem-bench.lock)
# with flock(1), so that benchmarks of others sharing the machine never run
# beside them; do not run the script itself under that lock.
#
# Environment: RECORDS (10000000), EXPIRED (5000000), SMALL (100000),
# PREFIX (idem_bench_scale_, the schemas' names), CLIENTS (16), ROUNDS (3),
# PURGE_BATCH (2000), PURGE_PAUSE_MS (10),
# LOADGEN (target/release/loadgen), KEEP=1 (keep the schemas), REUSE=1
# (use the kept schemas as they are: a purge stage left fewer expired
# records behind), and libpq's PGHOST (127.0.0.1),
# PGUSER (postgres), PGDATABASE (test).
set -euo pipefail

pairs=${1:-3}
seconds=${2:-30}
records=${RECORDS:-10000000}
expired=${EXPIRED:-5000000}
small=${SMALL:-100000}
clients=${CLIENTS:-16}
rounds=${ROUNDS:-3}
purge_batch=${PURGE_BATCH:-2000}
purge_pause=${PURGE_PAUSE_MS:-10}
lock=${LOCK:-/tmp/idem-bench.lock}
read -r -a stages <<< "${STAGES:-scale purge lean}"
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres} PGDATABASE=${PGDATABASE:-test}
root=$(cd "$(dirname "$0")/../.." && pwd)
loadgen=${LOADGEN:-$root/target/release/loadgen}
out=${OUT:-$root/target/scale-$(date +%Y%m%d-%H%M%S).txt}
url="postgres://$PGUSER@$PGHOST/$PGDATABASE"
migrations=$root/idem-runtime/migrations/postgres
prefix=${PREFIX:-idem_bench_scale_}
all=(small big small_noexp)

psql_() { PGOPTIONS="-c client_min_messages=warning" psql -Xq -v ON_ERROR_STOP=1 "$@"; }

drop_all() {
    for s in "${all[@]}"; do psql_ -c "DROP SCHEMA IF EXISTS $prefix$s CASCADE"; done
}
if [[ -z ${KEEP:-} ]]; then trap drop_all EXIT; fi

# load NAME RECORDS EXPIRED
# A record table as idem::migrate creates it, RECORDS records in 16 scopes
# with 32-character keys (an MD5 in hex, spread over the key's index as
# UUIDs are), EXPIRED of them past their retention (spread over the last
# day), the others kept 30 days; none in loadgen's scopes.
load() {
    local name=$1 n=$2 gone=$3 migration includes=
    local started=$SECONDS
    if [[ -n ${REUSE:-} ]] && psql -XAtc "SELECT 1 FROM pg_namespace WHERE nspname = '$prefix$name'" | grep -q 1; then
        echo "reusing $prefix$name" | tee -a "$out"
        return
    fi
    for migration in "$migrations"/*.sql; do includes+="\\i $migration"$'\n'; done
    flock "$lock" psql -Xq -v ON_ERROR_STOP=1 <<SQL
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS $prefix$name CASCADE;
CREATE SCHEMA $prefix$name;
SET search_path = $prefix$name;
$includes
-- Load, then build the indexes: a bulk load does not pay for them row by row.
ALTER TABLE idem_records DROP CONSTRAINT idem_records_pkey;
DROP INDEX idem_records_expires_at;
INSERT INTO idem_records (scope, idem_key, status, fingerprint, response, created_at, updated_at, expires_at)
SELECT 'scale.preload' || (g % 16), md5(g::text), 'DONE', md5('f' || g), (g * 7)::text,
       now() - interval '2 days', now() - interval '2 days',
       CASE WHEN g <= $gone THEN now() - (g % 86400) * interval '1 second'
            ELSE now() + interval '30 days' END
FROM generate_series(1, $n) g;
SET maintenance_work_mem = '512MB';
ALTER TABLE idem_records ADD CONSTRAINT idem_records_pkey PRIMARY KEY (scope, idem_key);
CREATE INDEX idem_records_expires_at ON idem_records (expires_at);
VACUUM (FREEZE, ANALYZE) idem_records;
SQL
    echo "loaded $prefix$name: $n records ($gone expired) in $((SECONDS - started)) s," \
        "$(psql -XAtc "SELECT pg_size_pretty(pg_total_relation_size('$prefix$name.idem_records')) || ', ' ||
                      coalesce(array_to_string(reloptions, ','), 'no options') FROM pg_class
                      WHERE oid = '$prefix$name.idem_records'::regclass")" | tee -a "$out"
}

# measure TAG SCHEMA [loadgen options]: one loadgen run on that schema's tables.
measure() {
    local tag=$1 schema=$prefix$2 line updates before after
    shift 2
    # The record table's updates, and how many were HOT (no index touched).
    updates="SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables
             WHERE schemaname = '$schema' AND relname = 'idem_records'"
    echo "== $tag ($(uptime | sed 's/.*load average: //'))" >&2
    before=$(psql -XAtc "$updates")
    line=$(flock "$lock" "$loadgen" --scenario dedup --database-url "$url?options[search_path]=$schema" \
        --clients "$clients" --seconds "$seconds" --rounds "$rounds" "$@" | tail -1)
    after=$(psql -XAtc "$updates")
    line+=" record_updates=$((${after% *} - ${before% *})) hot_updates=$((${after#* } - ${before#* }))"
    echo "tag=$tag load=\"$(uptime | sed 's/.*load average: //')\" $line" | tee -a "$out"
}

# interleave TAG:SCHEMA[:OPTIONS] ...: PAIRS turns, the order rotated each turn.
interleave() {
    local runs=("$@") i j k
    for ((i = 0; i < pairs; i++)); do
        for ((j = 0; j < ${#runs[@]}; j++)); do
            k=$(((i + j) % ${#runs[@]}))
            IFS=: read -r tag schema opts <<< "${runs[$k]}"
            # shellcheck disable=SC2086 # the options are words
            measure "$tag" "$schema" $opts
        done
    done
}

echo "# bench/scale/run.sh $pairs $seconds: RECORDS=$records EXPIRED=$expired SMALL=$small CLIENTS=$clients" \
    "ROUNDS=$rounds PURGE_BATCH=$purge_batch PURGE_PAUSE_MS=$purge_pause $(date -u +%FT%TZ)" | tee "$out"
for stage in "${stages[@]}"; do
    case $stage in
    scale)
        load small "$small" $((small * expired / records))
        load big "$records" "$expired"
        interleave scale_small:small scale_big:big
        ;;
    purge)
        psql -XAtc "SELECT 1 FROM pg_namespace WHERE nspname = '${prefix}big'" | grep -q 1 ||
            load big "$records" "$expired"
        interleave purge_off:big "purge_on:big:--purge-beside $purge_batch --purge-pause-ms $purge_pause"
        echo "expired records left in ${prefix}big:" \
            "$(psql -XAtc "SELECT count(*) FROM ${prefix}big.idem_records WHERE expires_at < now()")" | tee -a "$out"
        ;;
    lean)
        psql -XAtc "SELECT 1 FROM pg_namespace WHERE nspname = '${prefix}small'" | grep -q 1 ||
            load small "$small" $((small * expired / records))
        load small_noexp "$small" $((small * expired / records))
        psql_ -c "DROP INDEX ${prefix}small_noexp.idem_records_expires_at"
        interleave lean_as_is:small lean_no_expiry_index:small_noexp
        ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
    esac
done

# Medians per tag of the first calls' throughput and p99 (guarded = the
# default guard, one_write = claim = "commit" on an idem::Tx).
echo "# medians per tag" | tee -a "$out"
for tag in $(grep -o '^tag=[^ ]*' "$out" | cut -d= -f2 | sort -u); do
    grep "^tag=$tag " "$out" | awk -v tag="$tag" '
        function med(a, n,   i, j, t) {
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }
        {
            n++
            for (f = 1; f <= NF; f++) {
                split($f, kv, "=")
                v[kv[1], n] = kv[2]
            }
        }
        END {
            split("unguarded_tps guarded_tps claim_after_tps one_write_tps p99_us claim_after_p99_us one_write_p99_us ratio ratio_one_write purged record_updates hot_updates", keys, " ")
            line = "tag=" tag " runs=" n
            for (k = 1; k in keys; k++) {
                m = 0
                for (i = 1; i <= n; i++) if ((keys[k], i) in v) a[++m] = v[keys[k], i]
                if (m) line = line " " keys[k] "=" med(a, m)
            }
            print line
        }' | tee -a "$out"
done
echo "results: $out"
