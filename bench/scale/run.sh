#!/usr/bin/env bash
# loadgen's `dedup` scenario on a record table of 10 million records against
# one of 100,000, a purge of the expired half running beside the load, and
# the record table's expiry index measured (BENCHMARKS.md, R8), on
# PostgreSQL or MySQL/MariaDB (STORE).
#
#   bench/scale/run.sh [PAIRS] [SECONDS]      # defaults: 3 turns, 30 s per loadgen run
#
# Every table of a run (records, archive, the shop's tables) lives in a
# schema of its own, `idem_bench_scale_<name>` (on MySQL a database),
# reached through the connection's search_path (on MySQL its database): the
# shared `idem_records` is never touched, and all schemas are dropped at
# the end (KEEP=1 keeps them). Every file of idem-runtime/migrations/<store>
# makes the tables (so on PostgreSQL at fillfactor 90, 0003), and loadgen
# runs with `--skip-migrate`: idem::migrate would create a dropped index
# again. The records are loaded with `INSERT ... SELECT` from
# `generate_series` (MariaDB: the `seq_1_to_N` table), the indexes built
# after.
#
# Four stages, each PAIRS times with the order rotated, one loadgen run of
# SECONDS (`--rounds ROUNDS`) per table and turn:
#   scale:    small (SMALL records) vs big (RECORDS records, EXPIRED of them expired);
#   purge:    big vs big with `--purge-beside PURGE_BATCH` (purge_expired in
#             batches, PURGE_PAUSE_MS between them) while the rounds run;
#   lean:     small as migrated vs without the expiry index;
#   lean_big: big as migrated vs without the expiry index.
# STAGES ("scale purge lean") picks stages; each run's last line goes to
# OUT (target/scale-<time>.txt), tagged, and a summary of medians ends it.
#
# Each load and each loadgen run holds the lock LOCK (/tmp/idem-bench.lock)
# with flock(1), so that benchmarks of others sharing the machine never run
# beside them; do not run the script itself under that lock.
#
# Environment: STORE (postgres | mysql), RECORDS (10000000), EXPIRED
# (5000000), SMALL (100000), PREFIX (idem_bench_scale_, the schemas'
# names), CLIENTS (16), ROUNDS (3), PURGE_BATCH (2000), PURGE_PAUSE_MS (10),
# PURGE_PAUSE_FACTOR (0: `--purge-pause-factor`, a pause grown by each batch's time),
# LOADGEN (target/release/loadgen), KEEP=1 (keep the schemas), REUSE=1
# (use the kept schemas as they are: a purge stage left fewer expired
# records behind), libpq's PGHOST (127.0.0.1), PGUSER (postgres),
# PGDATABASE (test), and MYSQL_HOST (127.0.0.1), MYSQL_TCP_PORT (3306),
# MYSQL_USER (root). bench/scale/mariadb.sh runs it on a MariaDB server of
# its own (a buffer pool the shared server does not have).
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
purge_factor=${PURGE_PAUSE_FACTOR:-0}
lock=${LOCK:-/tmp/idem-bench.lock}
read -r -a stages <<< "${STAGES:-scale purge lean}"
store=${STORE:-postgres}
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres} PGDATABASE=${PGDATABASE:-test}
mysql_host=${MYSQL_HOST:-127.0.0.1}
mysql_port=${MYSQL_TCP_PORT:-3306}
mysql_user=${MYSQL_USER:-root}
root=$(cd "$(dirname "$0")/../.." && pwd)
loadgen=${LOADGEN:-$root/target/release/loadgen}
migrations=$root/idem-runtime/migrations/$store
out=${OUT:-$root/target/scale-$(date +%Y%m%d-%H%M%S).txt}
prefix=${PREFIX:-idem_bench_scale_}
all=(small big small_noexp big_noexp)
[[ -x $loadgen ]] || {
    echo "no $loadgen: cargo build --release -p idem-bench (or LOADGEN=)" >&2
    exit 1
}

psql_() { PGOPTIONS="-c client_min_messages=warning" psql -Xq -v ON_ERROR_STOP=1 "$@"; }
mysql_() { mariadb -h "$mysql_host" -P "$mysql_port" -u "$mysql_user" --batch --skip-column-names "$@"; }

# Per store: url NAME (schema NAME's tables, as loadgen takes it), value
# QUERY (one value of a query) and drop NAME (a schema, on MySQL a database).
case $store in
postgres)
    url() { echo "postgres://$PGUSER@$PGHOST/$PGDATABASE?options[search_path]=$1"; }
    value() { psql -XAtc "$1"; }
    drop() { psql_ -c "DROP SCHEMA IF EXISTS $prefix$1 CASCADE"; }
    ;;
mysql)
    url() { echo "mysql://$mysql_user@$mysql_host:$mysql_port/$1"; }
    value() { mysql_ -e "$1"; }
    drop() { mysql_ -e "DROP DATABASE IF EXISTS $prefix$1"; }
    ;;
*)
    echo "STORE is postgres or mysql, not $store" >&2
    exit 1
    ;;
esac

# Whether schema NAME is there (a database, on MySQL: both list it here).
exists() {
    value "SELECT 1 FROM information_schema.schemata WHERE schema_name = '$prefix$1'" | grep -q 1
}

drop_all() {
    for s in "${all[@]}"; do drop "$s"; done
}
if [[ -z ${KEEP:-} ]]; then trap drop_all EXIT; fi

# load NAME RECORDS EXPIRED
# A record table as the migrations create it, RECORDS records in 16 scopes
# with 32-character keys (an MD5 in hex, spread over the key's index as
# UUIDs are), EXPIRED of them past their retention (spread over the last
# day), the others kept 30 days; none in loadgen's scopes.
load() {
    local name=$1 n=$2 gone=$3 size migration includes=
    local started=$SECONDS
    if [[ -n ${REUSE:-} ]] && exists "$name"; then
        echo "reusing $prefix$name" | tee -a "$out"
        return
    fi
    drop "$name"
    case $store in
    postgres)
        for migration in "$migrations"/*.sql; do includes+="\\i $migration"$'\n'; done
        flock "$lock" psql -Xq -v ON_ERROR_STOP=1 <<SQL
SET client_min_messages = warning;
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
        size=$(value "SELECT pg_size_pretty(pg_total_relation_size('$prefix$name.idem_records')) || ', ' ||
                      coalesce(array_to_string(reloptions, ','), 'no options') FROM pg_class
                      WHERE oid = '$prefix$name.idem_records'::regclass")
        ;;
    mysql)
        # Without a primary key InnoDB appends to a hidden row id; the
        # primary key is then built in one sorted pass.
        mysql_ -e "CREATE DATABASE $prefix$name"
        cat "$migrations"/*.sql | mysql_ "$prefix$name"
        flock "$lock" mariadb -h "$mysql_host" -P "$mysql_port" -u "$mysql_user" "$prefix$name" > /dev/null <<SQL
ALTER TABLE idem_records DROP PRIMARY KEY, DROP INDEX idem_records_expires_at;
INSERT INTO idem_records (scope, idem_key, status, fingerprint, response, created_at, updated_at, expires_at)
SELECT CONCAT('scale.preload', seq % 16), MD5(seq), 'DONE', MD5(CONCAT('f', seq)), seq * 7,
       UTC_TIMESTAMP(6) - INTERVAL 2 DAY, UTC_TIMESTAMP(6) - INTERVAL 2 DAY,
       CASE WHEN seq <= $gone THEN UTC_TIMESTAMP(6) - INTERVAL (seq % 86400) SECOND
            ELSE UTC_TIMESTAMP(6) + INTERVAL 30 DAY END
FROM seq_1_to_$n;
ALTER TABLE idem_records ADD PRIMARY KEY (scope, idem_key), ADD INDEX idem_records_expires_at (expires_at);
ANALYZE TABLE idem_records;
SQL
        size="$(value "SELECT CONCAT(ROUND((data_length + index_length) / 1048576), ' MB') FROM information_schema.tables
                       WHERE table_schema = '$prefix$name' AND table_name = 'idem_records'")"
        ;;
    esac
    echo "loaded $prefix$name: $n records ($gone expired) in $((SECONDS - started)) s, $size" | tee -a "$out"
}

# no_expiry_index NAME: the table without its expiry index.
no_expiry_index() {
    case $store in
    postgres) psql_ -c "DROP INDEX $prefix$1.idem_records_expires_at" ;;
    mysql) mysql_ -e "DROP INDEX idem_records_expires_at ON $prefix$1.idem_records" ;;
    esac
}

# measure TAG SCHEMA [loadgen options]: one loadgen run on that schema's tables.
measure() {
    local tag=$1 schema=$prefix$2 line updates before after
    shift 2
    # The record table's updates, and how many were HOT (no index touched;
    # PostgreSQL only).
    updates="SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables
             WHERE schemaname = '$schema' AND relname = 'idem_records'"
    echo "== $tag ($(uptime | sed 's/.*load average: //'))" >&2
    [[ $store == postgres ]] && before=$(value "$updates")
    line=$(flock "$lock" "$loadgen" --scenario dedup --database-url "$(url "$schema")" \
        --clients "$clients" --seconds "$seconds" --rounds "$rounds" --skip-migrate "$@" | tail -1)
    if [[ $store == postgres ]]; then
        after=$(value "$updates")
        line+=" record_updates=$((${after% *} - ${before% *})) hot_updates=$((${after#* } - ${before#* }))"
    fi
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

server=$([[ $store == postgres ]] && echo "$PGHOST" || echo "$mysql_host:$mysql_port")
echo "# bench/scale/run.sh $pairs $seconds: STORE=$store ($server) RECORDS=$records EXPIRED=$expired SMALL=$small CLIENTS=$clients" \
    "ROUNDS=$rounds PURGE_BATCH=$purge_batch PURGE_PAUSE_MS=$purge_pause PURGE_PAUSE_FACTOR=$purge_factor" \
    "$(date -u +%FT%TZ)" | tee "$out"
for stage in "${stages[@]}"; do
    case $stage in
    scale)
        load small "$small" $((small * expired / records))
        load big "$records" "$expired"
        interleave scale_small:small scale_big:big
        ;;
    purge)
        exists big || load big "$records" "$expired"
        interleave purge_off:big "purge_on:big:--purge-beside $purge_batch --purge-pause-ms $purge_pause --purge-pause-factor $purge_factor"
        now=$([[ $store == postgres ]] && echo "now()" || echo "UTC_TIMESTAMP(6)")
        echo "expired records left in ${prefix}big:" \
            "$(value "SELECT count(*) FROM ${prefix}big.idem_records WHERE expires_at < $now")" | tee -a "$out"
        ;;
    lean)
        exists small || load small "$small" $((small * expired / records))
        load small_noexp "$small" $((small * expired / records))
        no_expiry_index small_noexp
        interleave lean_as_is:small lean_no_expiry_index:small_noexp
        ;;
    lean_big)
        exists big || load big "$records" "$expired"
        load big_noexp "$records" "$expired"
        no_expiry_index big_noexp
        interleave lean_big_as_is:big lean_big_no_expiry_index:big_noexp
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
            split("unguarded_tps guarded_tps claim_after_tps one_write_tps p99_us claim_after_p99_us one_write_p99_us ratio ratio_claim_after ratio_one_write purged record_updates hot_updates", keys, " ")
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
