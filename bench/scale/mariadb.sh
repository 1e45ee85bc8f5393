#!/usr/bin/env bash
# A MariaDB server of the benchmark's own, for a run that needs server
# settings the shared one does not have (the shared server is never
# reconfigured, restarted or flushed): a fresh data directory under /tmp, a
# port of its own on 127.0.0.1, the buffer pool BUFFER_POOL (default 4G:
# the 10 M-record table of bench/scale/run.sh, 2.1 GB, fits; otherwise the
# shared server's settings: utf8mb4, no binary log). It runs
# COMMAND with MYSQL_TCP_PORT set to that port (the mariadb clients and
# bench/scale/run.sh read it), then stops the server and removes the
# directory, interrupted or not.
#
#   bench/scale/mariadb.sh PORT COMMAND...
#   BUFFER_POOL=4G bench/scale/mariadb.sh 3307 env STORE=mysql STAGES="scale purge" bench/scale/run.sh 3 70
#
# Root only (mariadbd runs as root here, `--user=root`).
set -euo pipefail

port=${1:?usage: bench/scale/mariadb.sh PORT COMMAND...}
shift
(($# > 0)) || {
    echo "usage: bench/scale/mariadb.sh PORT COMMAND..." >&2
    exit 2
}
pool=${BUFFER_POOL:-4G}
if (echo > "/dev/tcp/127.0.0.1/$port") 2> /dev/null; then
    echo "port $port is taken: pick a free one" >&2
    exit 1
fi
dir=$(mktemp -d /tmp/idem-bench-mariadb.XXXXXX)
pid=''
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
    set +e
    if [[ -n $pid ]]; then
        kill "$pid" 2> /dev/null
        wait "$pid" 2> /dev/null
    fi
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mariadb-install-db --no-defaults --user=root --datadir="$dir/data" --auth-root-authentication-method=normal \
    --skip-test-db > "$dir/install.log" 2>&1 || {
    cat "$dir/install.log" >&2
    exit 1
}
mariadbd --no-defaults --user=root --datadir="$dir/data" --socket="$dir/sock" --pid-file="$dir/pid" \
    --bind-address=127.0.0.1 --port="$port" --innodb-buffer-pool-size="$pool" --skip-log-bin \
    --character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci --max-connections=200 \
    > "$dir/server.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
    mariadb --no-defaults -h 127.0.0.1 -P "$port" -u root -e "SELECT 1" > /dev/null 2>&1 && break
    kill -0 "$pid" 2> /dev/null || {
        cat "$dir/server.log" >&2
        exit 1
    }
    sleep 0.2
done
mariadb --no-defaults -h 127.0.0.1 -P "$port" -u root -e "CREATE DATABASE IF NOT EXISTS test"
echo "mariadb.sh: MariaDB on 127.0.0.1:$port, buffer pool $pool, data in $dir" >&2
MYSQL_TCP_PORT=$port "$@"
