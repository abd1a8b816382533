#!/usr/bin/env bash
# Start the database services that dbwarden's integration tests talk to.
#
#   scripts/services.sh                    # all: postgres mariadb galera redis redis-cluster redis-sentinel
#                                          # clickhouse clickhouse-cluster etcd pg-extras pg-standby promtool
#   scripts/services.sh postgres redis     # only these
#   scripts/services.sh pg-extras          # PostgreSQL plus two PgBouncers (see its section)
#   scripts/services.sh sqlite-only        # nothing (SQLite needs no server)
#
# Runs as root, idempotent: a service that already answers is left alone, so a
# second run is a fast no-op. A missing server is installed from Debian's
# packages (one `apt-get update` at most per run), started, provisioned
# (PostgreSQL: trust auth on 127.0.0.1, roles root/postgres, database test;
# MariaDB: root with an empty password over 127.0.0.1, database test) and
# waited for, with a bounded wait. Exits non-zero, naming the service, when
# one cannot be made ready.
#
#   PostgreSQL  127.0.0.1:5432   postgres://root@127.0.0.1:5432/test
#   PostgreSQL pair 127.0.0.1:5433,5434 (primary + streaming standby; pg-failover swaps them)
#   MariaDB     127.0.0.1:3306   mysql://root@127.0.0.1:3306/test
#   Galera      127.0.0.1:3311,3312,3313  mysql://root@127.0.0.1:3311/test  (3 nodes, cluster dbw;
#               `galera-kill-n2` kill -9s one node; `galera` brings it back)
#   Redis       127.0.0.1:6379   redis://127.0.0.1:6379
#   Redis Cluster 127.0.0.1:7001-7003  redis+cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
#   Redis Sentinel 127.0.0.1:26390 (primary :6390, replica :6391)  redis+sentinel://127.0.0.1:26390/dbwarden
#   ClickHouse  127.0.0.1:8123 (HTTP), 127.0.0.1:9000 (native TCP)
#   ClickHouse cluster 127.0.0.1:8124,8125 (HTTP; native 9011,9012), cluster dbw, ZooKeeper 127.0.0.1:2182
#               clickhouse://127.0.0.1:8124/<db> with cluster=dbw (`clickhouse-cluster-stop-n2` stops
#               the second node; `clickhouse-cluster` starts it again)
#   etcd        127.0.0.1:2379,2381,2383 (3 members)  etcd://127.0.0.1:2379,127.0.0.1:2381,127.0.0.1:2383
#               (`etcd-kill-leader` kill -9s the leader; `etcd` starts it again)
#   protoc      Debian's protobuf-compiler: building the etcd engine (dbwarden-etcd) needs it
#
# Environment:
#   DBWARDEN_CI_STATE            state folder (default /var/lib/dbwarden-ci); ClickHouse
#                                keeps its data, pid file and logs in $DBWARDEN_CI_STATE/clickhouse
#   DBWARDEN_SERVICES_TIMEOUT    seconds to wait for each service to become ready (default 90)
set -euo pipefail

STATE_DIR="${DBWARDEN_CI_STATE:-/var/lib/dbwarden-ci}"
WAIT_TIMEOUT="${DBWARDEN_SERVICES_TIMEOUT:-90}"
CH_DIR="$STATE_DIR/clickhouse"
APT_LOG="$STATE_DIR/apt.log"

PG_PORT=5432
MY_PORT=3306
REDIS_PORT=6379
CH_HTTP_PORT=8123
CH_TCP_PORT=9000

log() { printf '[services] %s\n' "$*"; }
die() {
    printf '[services] ERROR: %s\n' "$*" >&2
    exit 1
}
have() { command -v "$1" >/dev/null 2>&1; }

# ---------------------------------------------------------------------------
# helpers

APT_UPDATED=0
apt_install() {
    local svc="$1"
    shift
    export DEBIAN_FRONTEND=noninteractive
    local apt_opts=(-o DPkg::Lock::Timeout=300 -o Dpkg::Use-Pty=0 -q -y)
    if [[ $APT_UPDATED -eq 0 ]]; then
        log "apt-get update (needed for $svc)"
        if ! run_detached "$APT_LOG" apt-get "${apt_opts[@]}" update; then
            tail -n 30 "$APT_LOG" >&2 || true
            die "$svc: apt-get update failed (log: $APT_LOG)"
        fi
        APT_UPDATED=1
    fi
    log "$svc: apt-get install $*"
    if ! run_detached "$APT_LOG" apt-get "${apt_opts[@]}" install "$@"; then
        tail -n 30 "$APT_LOG" >&2 || true
        die "$svc: apt-get install $* failed (log: $APT_LOG)"
    fi
}

# run_detached LOG CMD...: run CMD with stdin from /dev/null, its output appended to LOG and
# every other inherited descriptor closed, so that a daemon it leaves behind holds neither
# this script's lock (fd 9) nor the pipes of whoever ran this script (a CI runner waits for
# those to close).
run_detached() {
    local logf="$1"
    shift
    (
        for fd in /proc/"$BASHPID"/fd/*; do
            fd="${fd##*/}"
            if [[ $fd =~ ^[0-9]+$ ]] && ((fd > 2)); then
                eval "exec $fd>&-" 2>/dev/null || true
            fi
        done
        exec "$@" </dev/null >>"$logf" 2>&1
    )
}

# tcp_listening PORT: a socket listens on PORT (read from /proc, so no connection is made
# and no server logs a half-open probe)
tcp_listening() {
    local hex
    hex="$(printf '%04X' "$1")"
    awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# wait_until SECONDS CMD...: poll CMD until it succeeds; 1 on timeout
wait_until() {
    local secs="$1"
    shift
    local deadline=$((SECONDS + secs))
    while ! "$@"; do
        if ((SECONDS >= deadline)); then
            return 1
        fi
        sleep 0.5
    done
}

show_log_tail() {
    local f
    for f in "$@"; do
        if [[ -s $f ]]; then
            printf '[services] --- last lines of %s ---\n' "$f" >&2
            tail -n 25 "$f" >&2 || true
        fi
    done
}

# ---------------------------------------------------------------------------
# PostgreSQL

pg_psql_tcp() { # USER DB SQL
    PGCONNECT_TIMEOUT=3 psql -X -w -q -h 127.0.0.1 -p "$PG_PORT" -U "$1" -d "$2" -tAc "$3" 2>/dev/null
}

pg_ready() {
    have psql || return 1
    [[ "$(pg_psql_tcp root test 'SELECT 1')" == 1 ]] || return 1
    [[ "$(pg_psql_tcp postgres test 'SELECT 1')" == 1 ]] || return 1
}

pg_server_up() { pg_isready -q -h 127.0.0.1 -p "$PG_PORT" -t 2 >/dev/null 2>&1; }

# prints "VERSION NAME STATUS" of the cluster on $PG_PORT, nothing if none
pg_cluster() {
    pg_lsclusters -h 2>/dev/null | awk -v p="$PG_PORT" '$3 == p { print $1, $2, $4; exit }'
}

# psql as the postgres OS user over the local socket (peer or trust auth)
pg_admin() {
    runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -p "$PG_PORT" -d postgres -tA "$@"
}

ensure_postgres() {
    if pg_ready; then
        log "postgres: already running on 127.0.0.1:$PG_PORT"
        return 0
    fi
    log "postgres: not answering as root@127.0.0.1:$PG_PORT/test, setting it up"
    if ! have pg_ctlcluster || ! have psql || ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; then
        apt_install postgres postgresql postgresql-client
    fi

    local ver name status hba
    read -r ver name status < <(pg_cluster) || true
    if [[ -z ${ver:-} ]]; then
        if [[ -n "$(pg_lsclusters -h 2>/dev/null)" ]]; then
            pg_lsclusters >&2 || true
            die "postgres: no cluster uses port $PG_PORT (see the clusters above)"
        fi
        ver="$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -n | tail -n 1)"
        [[ -n $ver ]] || die "postgres: no server version under /usr/lib/postgresql"
        name=main
        log "postgres: creating cluster $ver/$name on port $PG_PORT"
        pg_createcluster --port="$PG_PORT" "$ver" "$name" >/dev/null
        status=down
    fi

    # trust auth for the tests (first matching line wins, so prepend)
    hba="/etc/postgresql/$ver/$name/pg_hba.conf"
    [[ -f $hba ]] || die "postgres: $hba not found"
    local want=() line
    for line in "local all all trust" "host all all 127.0.0.1/32 trust" "host all all ::1/128 trust"; do
        # compare with comments stripped and blanks squeezed
        if ! awk '{ sub(/#.*/, ""); $1 = $1; print }' "$hba" | grep -qxF "$line"; then
            want+=("$line")
        fi
    done
    if ((${#want[@]})); then
        log "postgres: adding trust auth to $hba"
        { printf '# added by dbwarden scripts/services.sh (test machine)\n'; printf '%s\n' "${want[@]}"; cat "$hba"; } >"$hba.new"
        chown --reference="$hba" "$hba.new"
        chmod --reference="$hba" "$hba.new"
        mv "$hba.new" "$hba"
        [[ $status != online ]] || pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" reload </dev/null
    fi

    if [[ $status != online ]]; then
        install -d -o postgres -g postgres -m 2775 /var/run/postgresql
        log "postgres: starting cluster $ver/$name"
        run_detached "$STATE_DIR/postgres-start.log" pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start ||
            { show_log_tail "$STATE_DIR/postgres-start.log" "/var/log/postgresql/postgresql-$ver-$name.log"; die "postgres: pg_ctlcluster $ver $name start failed"; }
    fi
    if ! wait_until "$WAIT_TIMEOUT" pg_server_up; then
        show_log_tail "/var/log/postgresql/postgresql-$ver-$name.log"
        die "postgres: not accepting connections on 127.0.0.1:$PG_PORT after ${WAIT_TIMEOUT}s"
    fi

    # roles and databases (check, then create)
    pg_admin -c "DO \$\$BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'root') THEN CREATE ROLE root LOGIN SUPERUSER; END IF;
    END\$\$;" >/dev/null || die "postgres: could not create role root"
    local db
    for db in test root; do
        if [[ "$(pg_admin -c "SELECT 1 FROM pg_database WHERE datname = '$db'")" != 1 ]]; then
            log "postgres: creating database $db"
            pg_admin -c "CREATE DATABASE \"$db\" OWNER root" >/dev/null || die "postgres: could not create database $db"
        fi
    done

    pg_ready || die "postgres: running, but root@127.0.0.1:$PG_PORT/test (trust auth) still fails"
    log "postgres: ready on 127.0.0.1:$PG_PORT"
}

# A session that waits over deadlock_timeout (1 s) for a lock is logged with the pid that holds
# it: when a test sees a statement wait (a chaos runner once waited 30 s on a plain read of
# dbwarden_lock), the server log names who held the table.
pg_log_lock_waits() {
    [[ "$(pg_admin -c "SHOW log_lock_waits")" == on ]] && return 0
    pg_admin -c "ALTER SYSTEM SET log_lock_waits = on" >/dev/null &&
        pg_admin -c "SELECT pg_reload_conf()" >/dev/null ||
        die "postgres: could not turn on log_lock_waits"
    log "postgres: log_lock_waits on (lock waits over 1 s are logged with their holder)"
}

# ---------------------------------------------------------------------------
# MariaDB

my_client() {
    if have mariadb; then echo mariadb; elif have mysql; then echo mysql; else return 1; fi
}

# what the tests do: root, empty password, TCP to 127.0.0.1, database test
my_ready() {
    local cli
    cli="$(my_client)" || return 1
    [[ "$("$cli" --no-defaults --protocol=TCP -h 127.0.0.1 -P "$MY_PORT" -u root --connect-timeout=3 \
        -N -B -e 'SELECT 1' test 2>/dev/null)" == 1 ]]
}

# the server answers at all (mysqladmin ping is 0 even on "access denied")
my_server_up() {
    local adm
    if have mariadb-admin; then adm=mariadb-admin; else adm=mysqladmin; fi
    "$adm" --no-defaults --protocol=TCP -h 127.0.0.1 -P "$MY_PORT" -u root --connect-timeout=2 ping >/dev/null 2>&1
}

my_pidfile() {
    local p=""
    if have my_print_defaults; then
        p="$(my_print_defaults --mysqld 2>/dev/null | sed -n 's/^--pid-file=//p' | tail -n 1)"
    fi
    echo "${p:-/run/mysqld/mysqld.pid}"
}

my_datadir() {
    local d=""
    if have my_print_defaults; then
        d="$(my_print_defaults --mysqld 2>/dev/null | sed -n 's/^--datadir=//p' | tail -n 1)"
    fi
    echo "${d:-/var/lib/mysql}"
}

ensure_mariadb() {
    if my_ready; then
        log "mariadb: already running on 127.0.0.1:$MY_PORT"
        return 0
    fi
    log "mariadb: not answering as root@127.0.0.1:$MY_PORT/test, setting it up"
    if [[ ! -x /usr/sbin/mariadbd ]] || ! my_client >/dev/null; then
        apt_install mariadb mariadb-server mariadb-client
    fi
    local errlog=/var/log/mysql/error.log datadir
    if ! my_server_up; then
        install -d -o mysql -g mysql -m 0755 /run/mysqld
        install -d -o mysql -g adm -m 2750 /var/log/mysql
        datadir="$(my_datadir)"
        if [[ ! -d $datadir/mysql ]]; then
            log "mariadb: initialising $datadir"
            install -d -o mysql -g mysql -m 0755 "$datadir"
            mariadb-install-db --user=mysql --datadir="$datadir" >>"$STATE_DIR/mariadb-install.log" 2>&1 ||
                { show_log_tail "$STATE_DIR/mariadb-install.log"; die "mariadb: mariadb-install-db failed"; }
        fi
        log "mariadb: starting mariadbd"
        # Matched by its pid file too: the Galera node is another mariadbd on this machine.
        run_detached "$STATE_DIR/mariadb-start.log" start-stop-daemon --start --oknodo --background \
            --pidfile "$(my_pidfile)" --exec /usr/sbin/mariadbd ||
            die "mariadb: start-stop-daemon could not start /usr/sbin/mariadbd"
        if ! wait_until "$WAIT_TIMEOUT" my_server_up; then
            show_log_tail "$STATE_DIR/mariadb-start.log" "$errlog"
            die "mariadb: not accepting connections on 127.0.0.1:$MY_PORT after ${WAIT_TIMEOUT}s"
        fi
    fi

    if ! my_ready; then
        # as OS root over the socket (unix_socket auth) make root@127.0.0.1 / ::1 / localhost
        # usable with an empty password and create the test database
        log "mariadb: granting root with an empty password over TCP, creating database test"
        "$(my_client)" -u root <<'SQL' || die "mariadb: provisioning root/test over the local socket failed"
CREATE DATABASE IF NOT EXISTS test;
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
CREATE USER IF NOT EXISTS 'root'@'::1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'::1' WITH GRANT OPTION;
ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
FLUSH PRIVILEGES;
SQL
    fi
    my_ready || die "mariadb: running, but root@127.0.0.1:$MY_PORT/test with an empty password still fails"
    log "mariadb: ready on 127.0.0.1:$MY_PORT"
}

# ---------------------------------------------------------------------------
# Redis

redis_ready() {
    # PING over bash's /dev/tcp: needs no redis-cli
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout 3 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "PING\r\n" >&3
        IFS= read -r -t 2 line <&3 || exit 1
        [[ $line == +PONG* ]]' _ "$REDIS_PORT" 2>/dev/null
}

ensure_redis() {
    if redis_ready; then
        log "redis: already running on 127.0.0.1:$REDIS_PORT"
        return 0
    fi
    log "redis: not answering PING on 127.0.0.1:$REDIS_PORT, starting it"
    if ! have redis-server; then
        apt_install redis redis-server
    fi
    if tcp_listening "$REDIS_PORT"; then
        die "redis: something listens on 127.0.0.1:$REDIS_PORT but does not answer PING"
    fi
    install -d -m 0750 /var/lib/redis
    install -d -m 2750 /var/log/redis
    run_detached "$STATE_DIR/redis-start.log" redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" \
        --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log ||
        { show_log_tail "$STATE_DIR/redis-start.log" /var/log/redis/ci.log; die "redis: redis-server failed to start"; }
    if ! wait_until "$WAIT_TIMEOUT" redis_ready; then
        show_log_tail /var/log/redis/ci.log
        die "redis: no PONG from 127.0.0.1:$REDIS_PORT after ${WAIT_TIMEOUT}s"
    fi
    log "redis: ready on 127.0.0.1:$REDIS_PORT"
}

# ---------------------------------------------------------------------------
# >>> Redis Cluster (dbwarden-redis) >>>
# Three masters on loopback, no replicas, state in $DBWARDEN_CI_STATE/redis-cluster/<port>:
#   redis+cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
# A healthy cluster is left alone; missing nodes are started; nodes that are up but not (or no
# longer) one healthy cluster are flushed, reset and joined again (they only hold test data).

REDIS_CLUSTER_PORTS=(7001 7002 7003)
REDIS_CLUSTER_DIR="$STATE_DIR/redis-cluster"

rc_cli() { # PORT ARGS...
    local port="$1"
    shift
    timeout 5 redis-cli -h 127.0.0.1 -p "$port" "$@" 2>/dev/null | tr -d '\r'
}

rc_node_up() { [[ "$(rc_cli "$1" PING)" == PONG ]]; }

rc_info() { # PORT FIELD: one field of CLUSTER INFO
    rc_cli "$1" CLUSTER INFO | awk -F: -v f="$2" '$1 == f { print $2 }'
}

# every node answers, sees all the others, and the 16384 slots are served
redis_cluster_ready() {
    have redis-cli || return 1
    local p
    for p in "${REDIS_CLUSTER_PORTS[@]}"; do
        [[ "$(rc_info "$p" cluster_state)" == ok ]] || return 1
        [[ "$(rc_info "$p" cluster_known_nodes)" == "${#REDIS_CLUSTER_PORTS[@]}" ]] || return 1
        [[ "$(rc_info "$p" cluster_slots_ok)" == 16384 ]] || return 1
    done
}

rc_all_up() {
    local p
    for p in "${REDIS_CLUSTER_PORTS[@]}"; do rc_node_up "$p" || return 1; done
}

ensure_redis_cluster() {
    local p addrs=() formed=0
    for p in "${REDIS_CLUSTER_PORTS[@]}"; do addrs+=("127.0.0.1:$p"); done
    if redis_cluster_ready; then
        log "redis-cluster: already running on ${addrs[*]}"
        return 0
    fi
    log "redis-cluster: not a healthy 3-master cluster on ${addrs[*]}, setting it up"
    if ! have redis-server || ! have redis-cli; then
        apt_install redis-cluster redis-server redis-tools
    fi
    for p in "${REDIS_CLUSTER_PORTS[@]}"; do
        rc_node_up "$p" && continue
        if tcp_listening "$p"; then
            die "redis-cluster: something listens on 127.0.0.1:$p but does not answer PING"
        fi
        mkdir -p "$REDIS_CLUSTER_DIR/$p"
        log "redis-cluster: starting node 127.0.0.1:$p"
        run_detached "$REDIS_CLUSTER_DIR/start.log" redis-server --port "$p" --bind 127.0.0.1 \
            --cluster-enabled yes --cluster-config-file "$REDIS_CLUSTER_DIR/$p/nodes.conf" \
            --cluster-node-timeout 5000 --save "" --appendonly no --dir "$REDIS_CLUSTER_DIR/$p" \
            --pidfile "$REDIS_CLUSTER_DIR/$p/redis.pid" --logfile "$REDIS_CLUSTER_DIR/$p/redis.log" \
            --daemonize yes ||
            { show_log_tail "$REDIS_CLUSTER_DIR/start.log" "$REDIS_CLUSTER_DIR/$p/redis.log"; die "redis-cluster: node $p failed to start"; }
    done
    if ! wait_until "$WAIT_TIMEOUT" rc_all_up; then
        show_log_tail "$REDIS_CLUSTER_DIR"/*/redis.log
        die "redis-cluster: nodes ${addrs[*]} not all answering PING after ${WAIT_TIMEOUT}s"
    fi
    # Restarted nodes that kept their nodes.conf rejoin on their own: give them a moment.
    for p in "${REDIS_CLUSTER_PORTS[@]}"; do
        [[ "$(rc_info "$p" cluster_known_nodes)" == "${#REDIS_CLUSTER_PORTS[@]}" ]] && formed=1
    done
    if ((formed)) && wait_until 20 redis_cluster_ready; then
        log "redis-cluster: ready on ${addrs[*]} (rejoined)"
        return 0
    fi
    log "redis-cluster: creating the cluster (flushing and resetting the nodes first)"
    for p in "${REDIS_CLUSTER_PORTS[@]}"; do
        rc_cli "$p" FLUSHALL >/dev/null || true
        rc_cli "$p" CLUSTER RESET HARD >/dev/null || true
    done
    run_detached "$REDIS_CLUSTER_DIR/create.log" redis-cli --cluster create "${addrs[@]}" \
        --cluster-replicas 0 --cluster-yes ||
        { show_log_tail "$REDIS_CLUSTER_DIR/create.log"; die "redis-cli --cluster create failed"; }
    if ! wait_until "$WAIT_TIMEOUT" redis_cluster_ready; then
        show_log_tail "$REDIS_CLUSTER_DIR/create.log" "$REDIS_CLUSTER_DIR"/*/redis.log
        die "redis-cluster: not healthy (cluster_state ok, 3 nodes, 16384 slots) after ${WAIT_TIMEOUT}s"
    fi
    log "redis-cluster: ready on ${addrs[*]}"
}
# <<< Redis Cluster (dbwarden-redis) <<<

# ---------------------------------------------------------------------------
# ClickHouse (Debian's clickhouse-server 18.16), run as root with its state in $CH_DIR

ch_ready() {
    have curl || return 1
    [[ "$(curl -sf --max-time 3 "http://127.0.0.1:$CH_HTTP_PORT/ping" 2>/dev/null)" == Ok.* ]] || return 1
    [[ "$(curl -sf --max-time 5 "http://127.0.0.1:$CH_HTTP_PORT/?query=SELECT%201" 2>/dev/null)" == 1 ]] || return 1
    tcp_listening "$CH_TCP_PORT"
}

ensure_clickhouse() {
    if ch_ready; then
        log "clickhouse: already running on 127.0.0.1:$CH_HTTP_PORT (HTTP) and :$CH_TCP_PORT (TCP)"
        return 0
    fi
    log "clickhouse: not answering on 127.0.0.1:$CH_HTTP_PORT, starting it"
    local pkgs=()
    have clickhouse-server || pkgs+=(clickhouse-server)
    have clickhouse-client || pkgs+=(clickhouse-client)
    have curl || pkgs+=(curl)
    if ((${#pkgs[@]})); then
        apt_install clickhouse "${pkgs[@]}"
    fi
    [[ -f /etc/clickhouse-server/config.xml ]] || die "clickhouse: /etc/clickhouse-server/config.xml missing"

    mkdir -p "$CH_DIR"
    local pidfile="$CH_DIR/clickhouse.pid" pid=""
    if [[ -s $pidfile ]]; then
        pid="$(tr -dc '0-9' <"$pidfile")"
        if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && grep -q clickhouse "/proc/$pid/cmdline" 2>/dev/null; then
            log "clickhouse: pid $pid (from $pidfile) is still alive, waiting for it"
        else
            # clickhouse-server refuses to start while its pid file exists
            rm -f "$pidfile"
            pid=""
        fi
    fi
    if [[ -z $pid ]]; then
        if tcp_listening "$CH_HTTP_PORT" || tcp_listening "$CH_TCP_PORT"; then
            die "clickhouse: port $CH_HTTP_PORT or $CH_TCP_PORT is taken by something that is not a ready ClickHouse"
        fi
        run_detached "$CH_DIR/clickhouse.stdout.log" \
            clickhouse-server --daemon --pid-file="$pidfile" --config-file=/etc/clickhouse-server/config.xml -- \
            --path="$CH_DIR/" --tmp_path="$CH_DIR/tmp/" --user_files_path="$CH_DIR/user_files/" \
            --format_schema_path="$CH_DIR/format_schemas/" \
            --http_port="$CH_HTTP_PORT" --tcp_port="$CH_TCP_PORT" --interserver_http_port=0 \
            --logger.log="$CH_DIR/clickhouse.log" --logger.errorlog="$CH_DIR/clickhouse.err.log" ||
            { show_log_tail "$CH_DIR/clickhouse.stdout.log" "$CH_DIR/clickhouse.err.log"; die "clickhouse: clickhouse-server --daemon failed"; }
    fi
    if ! wait_until "$WAIT_TIMEOUT" ch_ready; then
        show_log_tail "$CH_DIR/clickhouse.stdout.log" "$CH_DIR/clickhouse.err.log"
        die "clickhouse: not ready on 127.0.0.1:$CH_HTTP_PORT/$CH_TCP_PORT after ${WAIT_TIMEOUT}s (logs in $CH_DIR)"
    fi
    log "clickhouse: ready on 127.0.0.1:$CH_HTTP_PORT (HTTP) and :$CH_TCP_PORT (TCP), version $(curl -sf --max-time 5 "http://127.0.0.1:$CH_HTTP_PORT/?query=SELECT%20version()")"
}

# ---------------------------------------------------------------------------
# >>> ClickHouse cluster (clickhouse-cluster, clickhouse-cluster-stop-n2) >>>
# Two ClickHouse 18.16 replicas of cluster `dbw` (one shard, two replicas, macros {shard} and
# {replica}) behind Debian's ZooKeeper 3.8 on 127.0.0.1:2182, for tests/tests/clickhouse_cluster.rs.
# ZooKeeper starts first and must say `Mode: standalone` before a node starts: an ON CLUSTER
# query that reaches 18.16 while its DDL worker is still connecting to ZooKeeper crashes it.
CHC_DIR="$STATE_DIR/clickhouse-cluster"
CHC_ZK_PORT=2182
CHC_HTTP_PORTS=(8124 8125)
CHC_TCP_PORTS=(9011 9012)
CHC_INTER_PORTS=(9021 9022)

chc_zk_mode() {
    local reply
    reply="$( (exec 3<>"/dev/tcp/127.0.0.1/$CHC_ZK_PORT" && printf srvr >&3 && timeout 2 cat <&3) 2>/dev/null)" || return 1
    [[ $reply == *"Mode: standalone"* ]]
}

chc_zk_pid() {
    local pid
    pid="$(cat "$CHC_DIR/zk/zk.pid" 2>/dev/null)" || return 1
    [[ -n $pid ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "ZooKeeperServerMain" && echo "$pid"
}

chc_node_pid() {
    local pid
    pid="$(tr -dc '0-9' 2>/dev/null <"$CHC_DIR/n$1/clickhouse.pid")" || return 1
    [[ -n $pid ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$CHC_DIR/n$1/config.xml" && echo "$pid"
}

chc_node_ready() {
    local port="${CHC_HTTP_PORTS[$(($1 - 1))]}"
    [[ "$(curl -sf --max-time 5 "http://127.0.0.1:$port/" --data-binary \
        "SELECT count() FROM system.zookeeper WHERE path = '/'" 2>/dev/null)" =~ ^[1-9] ]]
}

chc_ready() { chc_zk_mode && chc_node_ready 1 && chc_node_ready 2; }

chc_start_zk() {
    chc_zk_mode && return 0
    if tcp_listening "$CHC_ZK_PORT" && ! chc_zk_pid >/dev/null; then
        die "clickhouse-cluster: port $CHC_ZK_PORT is taken by something that is not this ZooKeeper"
    fi
    mkdir -p "$CHC_DIR/zk/data"
    cat >"$CHC_DIR/zk/zoo.cfg" <<CFG
tickTime=500
dataDir=$CHC_DIR/zk/data
clientPort=$CHC_ZK_PORT
clientPortAddress=127.0.0.1
admin.enableServer=false
maxSessionTimeout=40000
4lw.commands.whitelist=srvr,ruok
CFG
    local cp="" jar
    for jar in zookeeper zookeeper-jute slf4j-api slf4j-simple netty-handler netty-common netty-buffer \
        netty-transport netty-codec netty-resolver netty-transport-native-epoll \
        netty-transport-native-unix-common commons-cli metrics-core snappy-java; do
        [[ -f /usr/share/java/$jar.jar ]] || die "clickhouse-cluster: /usr/share/java/$jar.jar missing (Debian's zookeeper package)"
        cp+="${cp:+:}/usr/share/java/$jar.jar"
    done
    if ! chc_zk_pid >/dev/null; then
        run_detached "$CHC_DIR/zk/zk.log" start-stop-daemon --start --background --make-pidfile \
            --pidfile "$CHC_DIR/zk/zk.pid" --exec /usr/bin/java -- -Xmx256m -cp "$cp" \
            org.apache.zookeeper.server.ZooKeeperServerMain "$CHC_DIR/zk/zoo.cfg" ||
            die "clickhouse-cluster: ZooKeeper did not start"
    fi
    wait_until "$WAIT_TIMEOUT" chc_zk_mode || {
        show_log_tail "$CHC_DIR/zk/zk.log"
        die "clickhouse-cluster: ZooKeeper on 127.0.0.1:$CHC_ZK_PORT never said Mode: standalone"
    }
}

chc_config() {
    local i="$1" dir="$CHC_DIR/n$1"
    mkdir -p "$dir/data" "$dir/tmp" "$dir/user_files" "$dir/format_schemas"
    cat >"$dir/config.xml" <<XML
<?xml version="1.0"?>
<yandex>
    <logger><level>information</level><log>$dir/clickhouse.log</log><errorlog>$dir/clickhouse.err.log</errorlog><size>50M</size><count>2</count></logger>
    <listen_host>127.0.0.1</listen_host>
    <http_port>${CHC_HTTP_PORTS[$((i - 1))]}</http_port>
    <tcp_port>${CHC_TCP_PORTS[$((i - 1))]}</tcp_port>
    <interserver_http_port>${CHC_INTER_PORTS[$((i - 1))]}</interserver_http_port>
    <interserver_http_host>127.0.0.1</interserver_http_host>
    <max_connections>4096</max_connections>
    <keep_alive_timeout>3</keep_alive_timeout>
    <max_concurrent_queries>200</max_concurrent_queries>
    <uncompressed_cache_size>1073741824</uncompressed_cache_size>
    <mark_cache_size>104857600</mark_cache_size>
    <path>$dir/data/</path>
    <tmp_path>$dir/tmp/</tmp_path>
    <user_files_path>$dir/user_files/</user_files_path>
    <format_schema_path>$dir/format_schemas/</format_schema_path>
    <users_config>/etc/clickhouse-server/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <remote_servers>
        <dbw>
            <shard>
                <internal_replication>true</internal_replication>
                <replica><host>127.0.0.1</host><port>${CHC_TCP_PORTS[0]}</port></replica>
                <replica><host>127.0.0.1</host><port>${CHC_TCP_PORTS[1]}</port></replica>
            </shard>
        </dbw>
    </remote_servers>
    <zookeeper>
        <node><host>127.0.0.1</host><port>$CHC_ZK_PORT</port></node>
        <session_timeout_ms>10000</session_timeout_ms>
    </zookeeper>
    <macros><shard>01</shard><replica>r$i</replica></macros>
    <distributed_ddl><path>/clickhouse/task_queue/ddl</path></distributed_ddl>
</yandex>
XML
}

chc_start_node() {
    local i="$1" dir="$CHC_DIR/n$1"
    chc_node_pid "$i" >/dev/null && return 0
    rm -f "$dir/clickhouse.pid"
    local p
    for p in "${CHC_HTTP_PORTS[$((i - 1))]}" "${CHC_TCP_PORTS[$((i - 1))]}" "${CHC_INTER_PORTS[$((i - 1))]}"; do
        tcp_listening "$p" && die "clickhouse-cluster: port $p is taken by something that is not node n$i"
    done
    chc_config "$i"
    run_detached "$dir/clickhouse.stdout.log" \
        clickhouse-server --daemon --pid-file="$dir/clickhouse.pid" --config-file="$dir/config.xml" ||
        { show_log_tail "$dir/clickhouse.stdout.log" "$dir/clickhouse.err.log"; die "clickhouse-cluster: node n$i did not start"; }
}

ensure_clickhouse_cluster() {
    if chc_ready; then
        log "clickhouse-cluster: already running (HTTP 127.0.0.1:${CHC_HTTP_PORTS[*]}, ZooKeeper :$CHC_ZK_PORT)"
        return 0
    fi
    log "clickhouse-cluster: starting ZooKeeper and the nodes that do not answer"
    have clickhouse-server || apt_install clickhouse clickhouse-server clickhouse-client
    have curl || apt_install clickhouse curl
    [[ -f /usr/share/java/zookeeper.jar ]] || apt_install clickhouse-cluster --no-install-recommends zookeeper
    have java || apt_install clickhouse-cluster --no-install-recommends default-jre-headless
    mkdir -p "$CHC_DIR"
    chc_start_zk
    chc_start_node 1
    chc_start_node 2
    if ! wait_until "$WAIT_TIMEOUT" chc_ready; then
        show_log_tail "$CHC_DIR/zk/zk.log" "$CHC_DIR/n1/clickhouse.err.log" "$CHC_DIR/n2/clickhouse.err.log"
        die "clickhouse-cluster: nodes on 127.0.0.1:${CHC_HTTP_PORTS[*]} not ready with ZooKeeper after ${WAIT_TIMEOUT}s (logs in $CHC_DIR)"
    fi
    log "clickhouse-cluster: ready (HTTP 127.0.0.1:${CHC_HTTP_PORTS[*]}, cluster dbw, ZooKeeper :$CHC_ZK_PORT)"
}

# Stop node n2 (SIGTERM, then its end awaited); `clickhouse-cluster` starts it again.
chc_stop_n2() {
    local pid
    pid="$(chc_node_pid 2)" || die "clickhouse-cluster: node n2 does not run"
    kill "$pid"
    wait_until 60 eval "! chc_node_pid 2 >/dev/null" || { kill -9 "$pid" 2>/dev/null; sleep 1; }
    log "clickhouse-cluster: stopped node n2 (pid $pid)"
}
# <<< ClickHouse cluster <<<

# ---------------------------------------------------------------------------
# >>> PostgreSQL primary + streaming standby (pg-standby, pg-failover) >>>
# A PostgreSQL pair of its own for the failover tests (tests/tests/pg_failover.rs): a primary
# streaming to a hot standby, on 127.0.0.1:5433 and :5434 (either port may be the primary after
# a failover), trust auth on 127.0.0.1, roles root/postgres, database test, fsync off (test data).
# Made with the PostgreSQL binaries already installed for 5432; data, sockets and logs in
# $STATE_DIR/pg-standby.
#   scripts/services.sh pg-standby     # make the pair ready: a primary, and a standby streaming
#                                      # from it (a server that is down is rebuilt as the standby)
#   scripts/services.sh pg-failover    # kill -9 the primary (its backends too, as a host that
#                                      # dies), promote the standby, wait until it is the primary
#   postgres://root@127.0.0.1:5433,127.0.0.1:5434/test?target_session_attrs=read-write

PGS_DIR="$STATE_DIR/pg-standby"
PGS_PORTS=(5433 5434)

pgs_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
pgs_as() { runuser -u postgres -- "$@"; }
pgs_psql() { # PORT SQL
    PGCONNECT_TIMEOUT=3 psql -X -w -q -h 127.0.0.1 -p "$1" -U postgres -d postgres -tAc "$2" 2>/dev/null
}
pgs_role() { # PORT -> primary | standby | down
    case "$(pgs_psql "$1" 'SELECT pg_is_in_recovery()')" in
    f) echo primary ;;
    t) echo standby ;;
    *) echo down ;;
    esac
}
pgs_other() { [[ $1 == "${PGS_PORTS[0]}" ]] && echo "${PGS_PORTS[1]}" || echo "${PGS_PORTS[0]}"; }
pgs_streaming() { # PRIMARY_PORT
    [[ "$(pgs_psql "$1" "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")" == 1 ]]
}
pgs_is_primary() { [[ "$(pgs_role "$1")" == primary ]]; }
pgs_gone() { # PID: not running (a zombie nobody reaped counts as gone)
    ! kill -0 "$1" 2>/dev/null && return 0
    [[ "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" == Z ]]
}
pgs_port_free() { ! tcp_listening "$1"; }
pgs_kill() { # PORT: kill -9 its postmaster and every backend, as a host that dies
    local pm kids
    [[ -s $PGS_DIR/$1/postmaster.pid ]] || return 0
    pm="$(head -1 "$PGS_DIR/$1/postmaster.pid")"
    [[ $pm =~ ^[0-9]+$ ]] || return 0
    # A pid file left by a server that is already gone may name a pid reused since: only a
    # postmaster of this data directory is killed.
    tr '\0' ' ' <"/proc/$pm/cmdline" 2>/dev/null | grep -qF -- "$PGS_DIR/$1" || return 0
    kids="$(pgrep -P "$pm" || true)"
    # shellcheck disable=SC2086
    kill -9 "$pm" $kids 2>/dev/null || true
    wait_until 30 pgs_gone "$pm" || die "pg-standby: postmaster $pm survived kill -9"
    wait_until 30 pgs_port_free "$1" || die "pg-standby: port $1 still listens after kill -9"
}
pgs_start() { # PORT (the server must not inherit fd 9, the lock of this script)
    pgs_as "$(pgs_bin)/pg_ctl" -D "$PGS_DIR/$1" -l "$PGS_DIR/$1.log" -w -t 60 start >/dev/null 9>&- ||
        { show_log_tail "$PGS_DIR/$1.log"; die "pg-standby: the server on $1 did not start"; }
}
pgs_init_primary() { # PORT
    local d="$PGS_DIR/$1" bin
    bin="$(pgs_bin)"
    [[ -x $bin/initdb ]] || die "pg-standby: no PostgreSQL binaries under /usr/lib/postgresql (run: scripts/services.sh postgres)"
    pgs_kill "$1"
    rm -rf "$d"
    install -d -o postgres -g postgres -m 0700 "$d"
    pgs_as "$bin/initdb" -D "$d" -U postgres --auth=trust >"$PGS_DIR/initdb.log" 2>&1 ||
        { show_log_tail "$PGS_DIR/initdb.log"; die "pg-standby: initdb failed"; }
    printf '%s\n' \
        "port = $1" \
        "listen_addresses = '127.0.0.1'" \
        "unix_socket_directories = '$PGS_DIR'" \
        'wal_level = replica' \
        'max_wal_senders = 10' \
        'hot_standby = on' \
        'wal_keep_size = 256MB' \
        'max_connections = 100' \
        'fsync = off' >>"$d/postgresql.conf"
    pgs_start "$1"
    pgs_psql "$1" "CREATE ROLE root SUPERUSER LOGIN" >/dev/null || true
    pgs_psql "$1" "CREATE DATABASE test OWNER root" >/dev/null || true
    [[ "$(pgs_psql "$1" "SELECT count(*) FROM pg_database WHERE datname = 'test'")" == 1 ]] ||
        die "pg-standby: could not provision the primary on $1"
}
pgs_init_standby() { # PORT FROM_PORT
    local d="$PGS_DIR/$1"
    pgs_kill "$1"
    rm -rf "$d"
    install -d -o postgres -g postgres -m 0700 "$d"
    pgs_as "$(pgs_bin)/pg_basebackup" -h 127.0.0.1 -p "$2" -U postgres -D "$d" -R -X stream -c fast \
        >"$PGS_DIR/basebackup.log" 2>&1 ||
        { show_log_tail "$PGS_DIR/basebackup.log"; die "pg-standby: pg_basebackup from $2 failed"; }
    sed -i "s/^port = .*/port = $1/" "$d/postgresql.conf"
    pgs_start "$1"
}

ensure_pg_standby() {
    install -d -o postgres -g postgres -m 0750 "$PGS_DIR"
    local a="${PGS_PORTS[0]}" b="${PGS_PORTS[1]}" primary="" ra rb
    ra="$(pgs_role "$a")" rb="$(pgs_role "$b")"
    if [[ $ra == primary && $rb == standby ]] && pgs_streaming "$a"; then primary=$a; fi
    if [[ $rb == primary && $ra == standby ]] && pgs_streaming "$b"; then primary=$b; fi
    if [[ -n $primary ]]; then
        log "pg-standby: primary on 127.0.0.1:$primary, standby on :$(pgs_other "$primary") streaming"
        return 0
    fi
    # Keep a primary that runs (the failover test's data is on it); rebuild the rest.
    if [[ $ra == primary ]]; then
        primary=$a
    elif [[ $rb == primary ]]; then
        primary=$b
    else
        log "pg-standby: creating a primary on 127.0.0.1:$a"
        primary=$a
        pgs_init_primary "$primary"
    fi
    log "pg-standby: (re)building the standby on 127.0.0.1:$(pgs_other "$primary") from :$primary"
    pgs_init_standby "$(pgs_other "$primary")" "$primary"
    wait_until "$WAIT_TIMEOUT" pgs_streaming "$primary" ||
        { show_log_tail "$PGS_DIR/$(pgs_other "$primary").log"; die "pg-standby: the standby does not stream"; }
    log "pg-standby: primary on 127.0.0.1:$primary, standby on :$(pgs_other "$primary") streaming"
}

pg_failover() {
    local a="${PGS_PORTS[0]}" b="${PGS_PORTS[1]}" primary standby
    if pgs_is_primary "$a" && [[ "$(pgs_role "$b")" == standby ]]; then
        primary=$a standby=$b
    elif pgs_is_primary "$b" && [[ "$(pgs_role "$a")" == standby ]]; then
        primary=$b standby=$a
    else
        die "pg-failover: no primary with a standby on $a/$b (run: scripts/services.sh pg-standby)"
    fi
    log "pg-failover: kill -9 of the primary on $primary, promoting $standby"
    pgs_kill "$primary"
    # Never two primaries: the old one must be gone before the standby is promoted.
    pgs_port_free "$primary" || die "pg-failover: the primary on $primary still listens after kill -9; not promoting"
    pgs_as "$(pgs_bin)/pg_ctl" -D "$PGS_DIR/$standby" -w -t 60 promote >/dev/null 9>&- ||
        die "pg-failover: could not promote $standby"
    wait_until "$WAIT_TIMEOUT" pgs_is_primary "$standby" || die "pg-failover: $standby is not a primary after promote"
    log "pg-failover: $standby is the primary; $primary is down (scripts/services.sh pg-standby rebuilds it)"
}
# <<< PostgreSQL primary + standby <<<

# >>> PostgreSQL extras for the dbwarden-postgres tests (pg-extras) >>>
# Two PgBouncer instances in front of the PostgreSQL above, and replication connections from
# 127.0.0.1 trusted (the read-replica test starts a throw-away standby with pg_basebackup).
#   127.0.0.1:6442  PgBouncer pool_mode = transaction  (dbwarden must refuse it)
#   127.0.0.1:6443  PgBouncer pool_mode = session      (dbwarden works through it)
# Spare ports on purpose: Debian's packaged pgbouncer service defaults to 6432.
# PgBouncer refuses to run as root, so both run as the postgres user; their config, pid files
# and logs live in $STATE_DIR/pgbouncer.

PGB_TX_PORT=6442
PGB_SESSION_PORT=6443
PGB_DIR="$STATE_DIR/pgbouncer"

pgb_ready() { # PORT
    [[ "$(PGCONNECT_TIMEOUT=3 psql -X -w -q -h 127.0.0.1 -p "$1" -U root -d test -tAc 'SELECT 1' 2>/dev/null)" == 1 ]]
}

pgb_both_ready() { pgb_ready "$PGB_TX_PORT" && pgb_ready "$PGB_SESSION_PORT"; }

ensure_pg_replication_trust() {
    local ver name status hba want=() line
    read -r ver name status < <(pg_cluster) || true
    [[ -n ${ver:-} ]] || die "pg-extras: no PostgreSQL cluster on port $PG_PORT"
    hba="/etc/postgresql/$ver/$name/pg_hba.conf"
    [[ -f $hba ]] || die "pg-extras: $hba not found"
    for line in "local replication all trust" "host replication all 127.0.0.1/32 trust"; do
        if ! awk '{ sub(/#.*/, ""); $1 = $1; print }' "$hba" | grep -qxF "$line"; then
            want+=("$line")
        fi
    done
    if ((${#want[@]})); then
        log "pg-extras: trusting replication connections from 127.0.0.1 in $hba"
        { printf '# added by dbwarden scripts/services.sh (read-replica test)\n'; printf '%s\n' "${want[@]}"; cat "$hba"; } >"$hba.new"
        chown --reference="$hba" "$hba.new"
        chmod --reference="$hba" "$hba.new"
        mv "$hba.new" "$hba"
        pg_admin -c "SELECT pg_reload_conf()" >/dev/null || die "pg-extras: could not reload PostgreSQL"
    fi
}

ensure_pgbouncer() {
    if pgb_both_ready; then
        log "pgbouncer: already running on 127.0.0.1:$PGB_TX_PORT (transaction) and :$PGB_SESSION_PORT (session)"
        return 0
    fi
    have pgbouncer || apt_install pgbouncer pgbouncer
    install -d -o postgres -g postgres -m 0750 "$PGB_DIR"
    # auth_type = trust still wants the user names listed
    printf '"root" ""\n"postgres" ""\n' >"$PGB_DIR/userlist.txt"
    chown postgres:postgres "$PGB_DIR/userlist.txt"
    chmod 0640 "$PGB_DIR/userlist.txt"
    local mode port ini pid
    for mode in transaction session; do
        if [[ $mode == transaction ]]; then port=$PGB_TX_PORT; else port=$PGB_SESSION_PORT; fi
        pgb_ready "$port" && continue
        ini="$PGB_DIR/$mode.ini"
        printf '%s\n' \
            '[databases]' \
            "* = host=127.0.0.1 port=$PG_PORT" \
            '' \
            '[pgbouncer]' \
            'listen_addr = 127.0.0.1' \
            "listen_port = $port" \
            'unix_socket_dir =' \
            'auth_type = trust' \
            "auth_file = $PGB_DIR/userlist.txt" \
            "pool_mode = $mode" \
            'max_client_conn = 500' \
            'default_pool_size = 40' \
            'ignore_startup_parameters = extra_float_digits,options' \
            "logfile = $PGB_DIR/$mode.log" \
            "pidfile = $PGB_DIR/$mode.pid" >"$ini"
        chown postgres:postgres "$ini"
        pid=""
        [[ -s $PGB_DIR/$mode.pid ]] && pid="$(tr -dc '0-9' <"$PGB_DIR/$mode.pid")"
        if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
            die "pgbouncer: pid $pid ($PGB_DIR/$mode.pid) runs but 127.0.0.1:$port does not answer"
        fi
        rm -f "$PGB_DIR/$mode.pid"
        if tcp_listening "$port"; then
            die "pgbouncer: port $port is taken by something that is not a ready PgBouncer"
        fi
        log "pgbouncer: starting pool_mode = $mode on 127.0.0.1:$port"
        run_detached "$PGB_DIR/$mode.start.log" runuser -u postgres -- pgbouncer -d "$ini" ||
            { show_log_tail "$PGB_DIR/$mode.start.log" "$PGB_DIR/$mode.log"; die "pgbouncer: could not start the $mode instance"; }
    done
    if ! wait_until "$WAIT_TIMEOUT" pgb_both_ready; then
        show_log_tail "$PGB_DIR/transaction.log" "$PGB_DIR/session.log"
        die "pgbouncer: not answering on 127.0.0.1:$PGB_TX_PORT and :$PGB_SESSION_PORT after ${WAIT_TIMEOUT}s"
    fi
    log "pgbouncer: ready on 127.0.0.1:$PGB_TX_PORT (transaction) and :$PGB_SESSION_PORT (session)"
}

ensure_pg_extras() {
    ensure_pg_replication_trust
    ensure_pgbouncer
}
# <<< PostgreSQL extras (pg-extras) <<<

# ---------------------------------------------------------------------------
# >>> Redis Sentinel (dbwarden-redis) >>>
# A primary, one replica and one sentinel on loopback, state in $DBWARDEN_CI_STATE/redis-sentinel:
#   redis+sentinel://127.0.0.1:26390/dbwarden    (primary 127.0.0.1:6390, replica 127.0.0.1:6391)
# The tests that fail a primary over start their own trio; this one only serves the
# redis+sentinel:// tests that need a steady one. A healthy trio (the sentinel names a primary
# that has an online replica) is left alone; anything else is stopped and started afresh
# (it only holds test data).

RS_PRIMARY=6390
RS_REPLICA=6391
RS_SENTINEL=26390
RS_DIR="$STATE_DIR/redis-sentinel"

rs_primary_addr() { # "host port" the sentinel names, nothing if none
    rc_cli "$RS_SENTINEL" SENTINEL get-master-addr-by-name dbwarden | paste -sd' '
}

redis_sentinel_ready() {
    have redis-cli || return 1
    local addr port
    addr="$(rs_primary_addr)"
    [[ -n $addr ]] || return 1
    port="${addr#* }"
    [[ "$(rc_cli "$port" ROLE | head -1)" == master ]] || return 1
    rc_cli "$port" INFO replication | grep -q '^slave0:.*state=online'
}

rs_stop_all() {
    local p pid
    for p in "$RS_PRIMARY" "$RS_REPLICA" "$RS_SENTINEL"; do
        pid="$(cat "$RS_DIR/$p/redis.pid" 2>/dev/null || true)"
        [[ -n $pid ]] && kill "$pid" 2>/dev/null || true
    done
    wait_until 10 bash -c "! (exec 3<>/dev/tcp/127.0.0.1/$RS_PRIMARY) 2>/dev/null && ! (exec 3<>/dev/tcp/127.0.0.1/$RS_REPLICA) 2>/dev/null && ! (exec 3<>/dev/tcp/127.0.0.1/$RS_SENTINEL) 2>/dev/null" || true
}

ensure_redis_sentinel() {
    if redis_sentinel_ready; then
        log "redis-sentinel: already running (sentinel 127.0.0.1:$RS_SENTINEL names primary $(rs_primary_addr | tr ' ' :))"
        return 0
    fi
    log "redis-sentinel: no healthy primary + replica + sentinel, starting them afresh"
    if ! have redis-server || ! have redis-cli; then
        apt_install redis-sentinel redis-server redis-tools
    fi
    rs_stop_all
    local p
    for p in "$RS_PRIMARY" "$RS_REPLICA" "$RS_SENTINEL"; do
        tcp_listening "$p" && die "redis-sentinel: something else listens on 127.0.0.1:$p"
        rm -rf "${RS_DIR:?}/$p"
        mkdir -p "$RS_DIR/$p"
    done
    local common=(--bind 127.0.0.1 --save "" --appendonly no --daemonize yes --repl-diskless-sync-delay 0)
    run_detached "$RS_DIR/start.log" redis-server --port "$RS_PRIMARY" "${common[@]}" --dir "$RS_DIR/$RS_PRIMARY" \
        --pidfile "$RS_DIR/$RS_PRIMARY/redis.pid" --logfile "$RS_DIR/$RS_PRIMARY/redis.log" ||
        { show_log_tail "$RS_DIR/start.log"; die "redis-sentinel: the primary failed to start"; }
    run_detached "$RS_DIR/start.log" redis-server --port "$RS_REPLICA" "${common[@]}" --dir "$RS_DIR/$RS_REPLICA" \
        --pidfile "$RS_DIR/$RS_REPLICA/redis.pid" --logfile "$RS_DIR/$RS_REPLICA/redis.log" \
        --replicaof 127.0.0.1 "$RS_PRIMARY" ||
        { show_log_tail "$RS_DIR/start.log"; die "redis-sentinel: the replica failed to start"; }
    # A sentinel rewrites its configuration file: it gets one of its own.
    cat >"$RS_DIR/$RS_SENTINEL/sentinel.conf" <<CONF
port $RS_SENTINEL
bind 127.0.0.1
daemonize yes
pidfile $RS_DIR/$RS_SENTINEL/redis.pid
logfile $RS_DIR/$RS_SENTINEL/redis.log
dir $RS_DIR/$RS_SENTINEL
sentinel monitor dbwarden 127.0.0.1 $RS_PRIMARY 1
sentinel down-after-milliseconds dbwarden 1000
sentinel failover-timeout dbwarden 5000
CONF
    run_detached "$RS_DIR/start.log" redis-server "$RS_DIR/$RS_SENTINEL/sentinel.conf" --sentinel ||
        { show_log_tail "$RS_DIR/start.log"; die "redis-sentinel: the sentinel failed to start"; }
    if ! wait_until "$WAIT_TIMEOUT" redis_sentinel_ready; then
        show_log_tail "$RS_DIR"/*/redis.log
        die "redis-sentinel: the sentinel does not name a primary with an online replica after ${WAIT_TIMEOUT}s"
    fi
    log "redis-sentinel: ready (sentinel 127.0.0.1:$RS_SENTINEL, primary 127.0.0.1:$RS_PRIMARY, replica 127.0.0.1:$RS_REPLICA)"
}

# ---------------------------------------------------------------------------
# >>> Galera (dbwarden-mysql) >>>
# Three MariaDB 10.11 nodes with wsrep_on (Debian's galera-4), one cluster `dbw`, on
# 127.0.0.1:3311, 3312, 3313 (group communication on 4567, 4577, 4587; IST one above each);
# data, socket, pid file and error log in $DBWARDEN_CI_STATE/galera/nN; root with an empty
# password over TCP, database test, as the single server.
#
# rsync SST fails here on a mode-700 datadir, so no node is ever built by SST: when no node
# runs (or a node has no data), the cluster is made anew from one initialised datadir copied
# to all three, n1 bootstrapped and the others joined by IST from position 0. A node that was
# killed (`galera-kill N`, the tests) rejoins the running ones on its own data, by IST.
GALERA_DIR="$STATE_DIR/galera"
GALERA_PORT=3311
GALERA_NODES=(n1 n2 n3)
GALERA_PORTS=(3311 3312 3313)
GALERA_GCOMM=(4567 4577 4587)

galera_all_gcomm() {
    local g out=()
    for g in "${GALERA_GCOMM[@]}"; do out+=("127.0.0.1:$g"); done
    local IFS=,
    echo "${out[*]}"
}

# PORT: the node answers over TCP as root with wsrep_on, is ready, and sees the whole cluster.
galera_node_ready() {
    local cli
    cli="$(my_client)" || return 1
    [[ "$("$cli" --no-defaults --protocol=TCP -h 127.0.0.1 -P "$1" -u root --connect-timeout=3 \
        -N -B -e "SELECT @@wsrep_on, (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'wsrep_ready'), (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'wsrep_cluster_size')" test 2>/dev/null)" == $'1\tON\t3' ]]
}

galera_ready() {
    local p
    for p in "${GALERA_PORTS[@]}"; do galera_node_ready "$p" || return 1; done
}

# INDEX: the node's socket answers (it may still be joining).
galera_socket_up() {
    local adm
    if have mariadb-admin; then adm=mariadb-admin; else adm=mysqladmin; fi
    "$adm" --no-defaults --socket="$GALERA_DIR/${GALERA_NODES[$1]}/mysqld.sock" -u root --connect-timeout=2 ping >/dev/null 2>&1
}

# INDEX: the pid of the node's mariadbd, if it runs (its command line names its data directory).
galera_pid() {
    local dir="$GALERA_DIR/${GALERA_NODES[$1]}" pid
    pid="$(cat "$dir/mysqld.pid" 2>/dev/null)" || return 1
    [[ -n $pid ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--datadir=$dir/data" && echo "$pid"
}

# INDEX [ADDRESS [START_POSITION]]: start one node; ADDRESS empty bootstraps a new cluster.
galera_start() {
    local i="$1" address="${2:-}" position="${3:-}"
    local dir="$GALERA_DIR/${GALERA_NODES[$i]}" g="${GALERA_GCOMM[$i]}" extra=()
    [[ -n $position ]] && extra+=("--wsrep-start-position=$position")
    rm -f "$dir/mysqld.pid"
    run_detached "$GALERA_DIR/start.log" start-stop-daemon --start --background \
        --pidfile "$dir/mysqld.pid" --exec /usr/sbin/mariadbd -- \
        --no-defaults --user=mysql --datadir="$dir/data" --port="${GALERA_PORTS[$i]}" --bind-address=127.0.0.1 \
        --socket="$dir/mysqld.sock" --pid-file="$dir/mysqld.pid" --log-error="$dir/error.log" \
        --skip-name-resolve --default-storage-engine=InnoDB --binlog-format=ROW --innodb-autoinc-lock-mode=2 \
        --innodb-buffer-pool-size=128M --max-connections=300 \
        --wsrep-on=ON --wsrep-provider=/usr/lib/galera/libgalera_smm.so --wsrep-cluster-name=dbw \
        --wsrep-cluster-address="gcomm://$address" --wsrep-node-address=127.0.0.1 --wsrep-node-name="${GALERA_NODES[$i]}" \
        "--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:$g;ist.recv_addr=127.0.0.1:$((g + 1));gcache.size=128M" \
        "${extra[@]}" ||
        die "galera: start-stop-daemon could not start ${GALERA_NODES[$i]}"
}

galera_stop_all() {
    local i pid
    for i in 0 1 2; do
        if pid="$(galera_pid "$i")"; then kill -9 "$pid" 2>/dev/null || true; fi
    done
    for i in 0 1 2; do
        wait_until 20 eval "! galera_pid $i >/dev/null" || die "galera: ${GALERA_NODES[$i]} did not end after kill -9"
    done
}

# The cluster made anew: one datadir initialised and copied to the three, n1 bootstrapped
# and provisioned, n2 and n3 joined by IST.
galera_rebuild() {
    log "galera: making the three-node cluster anew"
    galera_stop_all
    local i seed="$GALERA_DIR/seed"
    rm -rf "$seed" "$GALERA_DIR"/n1 "$GALERA_DIR"/n2 "$GALERA_DIR"/n3
    install -d -o mysql -g mysql -m 0750 "$GALERA_DIR" "$seed"
    mariadb-install-db --no-defaults --user=mysql --datadir="$seed/data" >>"$GALERA_DIR/install.log" 2>&1 ||
        { show_log_tail "$GALERA_DIR/install.log"; die "galera: mariadb-install-db failed"; }
    for i in 0 1 2; do
        install -d -o mysql -g mysql -m 0750 "$GALERA_DIR/${GALERA_NODES[$i]}"
        cp -a "$seed/data" "$GALERA_DIR/${GALERA_NODES[$i]}/data"
    done
    rm -rf "$seed"
    galera_start 0 ""
    if ! wait_until "$WAIT_TIMEOUT" galera_socket_up 0; then
        show_log_tail "$GALERA_DIR/start.log" "$GALERA_DIR/n1/error.log"
        die "galera: n1 did not answer on its socket after ${WAIT_TIMEOUT}s"
    fi
    "$(my_client)" --no-defaults --socket="$GALERA_DIR/n1/mysqld.sock" -u root <<'SQL' || die "galera: provisioning root/test over n1's socket failed"
CREATE DATABASE IF NOT EXISTS test;
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
FLUSH PRIVILEGES;
SQL
    local uuid
    uuid="$("$(my_client)" --no-defaults --socket="$GALERA_DIR/n1/mysqld.sock" -u root -N -B \
        -e "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'wsrep_cluster_state_uuid'")" ||
        die "galera: cannot read n1's cluster state uuid"
    # The copies hold the data n1 had before its first write set: they catch up from there.
    for i in 1 2; do galera_start "$i" "127.0.0.1:${GALERA_GCOMM[0]}" "$uuid:0"; done
}

# Nodes that are down rejoin the running ones on their own data.
galera_rejoin() {
    local i
    for i in 0 1 2; do
        if ! galera_pid "$i" >/dev/null; then
            log "galera: ${GALERA_NODES[$i]} is down, rejoining the cluster"
            galera_start "$i" "$(galera_all_gcomm)"
        fi
    done
}

ensure_galera() {
    if galera_ready; then
        log "galera: already running on 127.0.0.1:${GALERA_PORTS[*]} (3 nodes)"
        return 0
    fi
    log "galera: not all three nodes answer, setting them up"
    if [[ ! -x /usr/sbin/mariadbd ]] || ! my_client >/dev/null; then
        apt_install galera mariadb-server mariadb-client
    fi
    [[ -f /usr/lib/galera/libgalera_smm.so ]] || apt_install galera galera-4
    local i running=0 complete=1
    for i in 0 1 2; do
        [[ -d $GALERA_DIR/${GALERA_NODES[$i]}/data/mysql ]] || complete=0
        if galera_pid "$i" >/dev/null; then running=1; elif tcp_listening "${GALERA_PORTS[$i]}"; then
            die "galera: port ${GALERA_PORTS[$i]} is taken by something that is not a Galera node of this cluster"
        fi
    done
    if ((running && complete)); then
        galera_rejoin
        if wait_until "$WAIT_TIMEOUT" galera_ready; then
            log "galera: ready on 127.0.0.1:${GALERA_PORTS[*]} (3 nodes, rejoined)"
            return 0
        fi
        log "galera: the nodes did not rejoin within ${WAIT_TIMEOUT}s; making the cluster anew"
    fi
    galera_rebuild
    if ! wait_until "$WAIT_TIMEOUT" galera_ready; then
        show_log_tail "$GALERA_DIR/start.log" "$GALERA_DIR/n1/error.log" "$GALERA_DIR/n2/error.log" "$GALERA_DIR/n3/error.log"
        die "galera: root@127.0.0.1:${GALERA_PORTS[*]}/test do not all answer with wsrep_ready and a cluster of 3 after ${WAIT_TIMEOUT}s"
    fi
    log "galera: ready on 127.0.0.1:${GALERA_PORTS[*]} (3 nodes)"
}

# INDEX: kill -9 one node (for the tests); `galera` brings it back.
galera_kill() {
    local pid
    pid="$(galera_pid "$1")" || die "galera: ${GALERA_NODES[$1]} does not run"
    kill -9 "$pid"
    wait_until 20 eval "! galera_pid $1 >/dev/null" || die "galera: ${GALERA_NODES[$1]} (pid $pid) did not end"
    log "galera: killed ${GALERA_NODES[$1]} (pid $pid)"
}
# <<< Galera <<<

# ---------------------------------------------------------------------------
# main

usage() {
    cat >&2 <<'EOF'
usage: scripts/services.sh [all | sqlite-only | none | postgres | pg-extras | pg-standby | pg-failover | mariadb | galera | galera-kill-n1|n2|n3 | redis | redis-cluster | redis-sentinel | clickhouse | clickhouse-cluster | clickhouse-cluster-stop-n2 | etcd | etcd-kill-leader | protoc | promtool]...
  aliases: pg/postgresql, mysql, ch; default: all
EOF
}

# >>> etcd (dbwarden-etcd): three members on loopback, client ports 2379 2381 2383, peer ports one
# above each. Each member runs under start-stop-daemon with a pid file, so a test can kill -9 one
# (`etcd-kill-leader`) and a second run of this script starts it again on its own data.
ETCD_DIR="$STATE_DIR/etcd"
ETCD_NAMES=(e1 e2 e3)
ETCD_CLIENT_PORTS=(2379 2381 2383)

etcd_cluster_flag() {
    local i out=()
    for i in 0 1 2; do out+=("${ETCD_NAMES[$i]}=http://127.0.0.1:$((ETCD_CLIENT_PORTS[i] + 1))"); done
    local IFS=,
    echo "${out[*]}"
}
etcd_member_up() { # CLIENT_PORT: answers its health check as part of a cluster with a leader
    curl -fsS -m 2 "http://127.0.0.1:$1/health" 2>/dev/null | grep -q '"health":"true"'
}
etcd_all_up() {
    local p
    for p in "${ETCD_CLIENT_PORTS[@]}"; do etcd_member_up "$p" || return 1; done
}
etcd_pid() { # NAME -> the pid of a running member, nothing otherwise
    local f="$ETCD_DIR/$1.pid" pid
    [[ -s $f ]] || return 0
    pid="$(cat "$f")"
    if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--name $1 "; then
        echo "$pid"
    fi
}

ensure_etcd() {
    local i name port
    if etcd_all_up; then
        log "etcd: already running on 127.0.0.1:${ETCD_CLIENT_PORTS[*]}"
        return 0
    fi
    have etcd || apt_install etcd etcd-server
    have curl || apt_install etcd curl
    mkdir -p "$ETCD_DIR"
    for i in 0 1 2; do
        name="${ETCD_NAMES[$i]}" port="${ETCD_CLIENT_PORTS[$i]}"
        [[ -n "$(etcd_pid "$name")" ]] && continue
        if tcp_listening "$port"; then
            die "etcd: something else listens on 127.0.0.1:$port"
        fi
        log "etcd: starting member $name on 127.0.0.1:$port"
        # A member with a data directory rejoins from it and ignores the --initial-* flags.
        run_detached "$ETCD_DIR/start.log" start-stop-daemon --start --background \
            --make-pidfile --pidfile "$ETCD_DIR/$name.pid" --exec /usr/bin/etcd -- \
            --name "$name" --data-dir "$ETCD_DIR/$name" \
            --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
            --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
            --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
            --initial-cluster "$(etcd_cluster_flag)" --initial-cluster-state new \
            --initial-cluster-token dbwarden-ci --logger zap --log-outputs "$ETCD_DIR/$name.log" ||
            die "etcd: member $name failed to start"
    done
    if ! wait_until "$WAIT_TIMEOUT" etcd_all_up; then
        show_log_tail "$ETCD_DIR"/e?.log
        die "etcd: the 3 members are not all healthy after ${WAIT_TIMEOUT}s"
    fi
    log "etcd: ready on 127.0.0.1:${ETCD_CLIENT_PORTS[*]} (3 members)"
}

# etcd-kill-leader: kill -9 the member that leads now (a test of the etcd lease under failover)
etcd_kill_leader() {
    local i name leader_id member_id pid
    for i in 0 1 2; do
        name="${ETCD_NAMES[$i]}"
        pid="$(etcd_pid "$name")"
        [[ -n $pid ]] || continue
        read -r member_id leader_id < <(curl -fsS -m 2 -X POST -d '{}' \
            "http://127.0.0.1:${ETCD_CLIENT_PORTS[$i]}/v3/maintenance/status" |
            python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["header"]["member_id"], s["leader"])') || continue
        if [[ $member_id == "$leader_id" ]]; then
            kill -9 "$pid"
            log "etcd-kill-leader: killed $name (pid $pid, 127.0.0.1:${ETCD_CLIENT_PORTS[$i]})"
            return 0
        fi
    done
    die "etcd-kill-leader: no running member says it leads"
}
# <<< etcd <<<

ensure_protoc() {
    have protoc || apt_install protoc protobuf-compiler
    log "protoc: $(protoc --version)"
}

# promtool and prometheus (Debian's prometheus package): the tests check the expositions with
# `promtool check metrics`, the shipped alert rules with `promtool test rules`, and start their own
# Prometheus (tests/tests/exporter.rs, on free loopback ports). Nothing is started here.
ensure_promtool() {
    if have promtool && have prometheus; then
        log "promtool: $(promtool --version 2>&1 | head -1)"
        return
    fi
    apt_install promtool --no-install-recommends prometheus
    have promtool && have prometheus || die "promtool/prometheus: not found after installing prometheus"
    log "promtool: $(promtool --version 2>&1 | head -1)"
}

want_pg=0 want_my=0 want_redis=0 want_ch=0 want_rc=0 want_rs=0 want_pgx=0 want_prom=0 want_gal=0 want_pgs=0 want_pgf=0 want_etcd=0 want_etcdk=0 want_protoc=0 want_chc=0 want_chcs=0 galk=-1
[[ $# -gt 0 ]] || set -- all
for arg in "$@"; do
    case "$arg" in
    all) want_pg=1 want_my=1 want_redis=1 want_ch=1 want_rc=1 want_rs=1 want_pgx=1 want_prom=1 want_gal=1 want_pgs=1 want_etcd=1 want_protoc=1 want_chc=1 ;;
    etcd) want_etcd=1 want_protoc=1 ;;
    etcd-kill-leader) want_etcdk=1 ;;
    protoc) want_protoc=1 ;;
    pg-standby) want_pg=1 want_pgs=1 ;;
    pg-failover) want_pgf=1 ;;
    promtool | prometheus) want_prom=1 ;;
    sqlite-only | sqlite) want_protoc=1 ;;
    none) ;;
    postgres | postgresql | pg) want_pg=1 ;;
    pg-extras | pgbouncer) want_pg=1 want_pgx=1 ;;
    mariadb | mysql) want_my=1 ;;
    galera) want_gal=1 ;;
    galera-kill-n1) galk=0 ;;
    galera-kill-n2) galk=1 ;;
    galera-kill-n3) galk=2 ;;
    redis) want_redis=1 ;;
    redis-cluster) want_rc=1 ;;
    redis-sentinel | sentinel) want_rs=1 ;;
    clickhouse | ch) want_ch=1 ;;
    clickhouse-cluster) want_chc=1 ;;
    clickhouse-cluster-stop-n2) want_chcs=1 ;;
    -h | --help)
        usage
        exit 0
        ;;
    *)
        usage
        die "unknown service '$arg'"
        ;;
    esac
done

if ((want_pg + want_my + want_redis + want_ch + want_rc + want_rs + want_pgx + want_prom + want_gal + want_pgs + want_pgf + want_etcd + want_etcdk + want_protoc + want_chc + want_chcs == 0 && galk < 0)); then
    log "no services requested"
    exit 0
fi

[[ $(id -u) -eq 0 ]] || die "must run as root (installs packages and starts servers)"
mkdir -p "$STATE_DIR"
# one run at a time (two CI steps starting the same servers would race)
exec 9>"$STATE_DIR/services.lock"
flock -w 600 9 || die "another scripts/services.sh still holds $STATE_DIR/services.lock after 600s"

start=$SECONDS
if ((want_pg)); then
    ensure_postgres
    pg_log_lock_waits
fi
if ((want_pgx)); then ensure_pg_extras; fi
if ((want_pgs)); then ensure_pg_standby; fi
if ((want_pgf)); then pg_failover; fi
if ((want_my)); then ensure_mariadb; fi
if ((want_gal)); then ensure_galera; fi
if ((galk >= 0)); then galera_kill "$galk"; fi
if ((want_redis)); then ensure_redis; fi
if ((want_rc)); then ensure_redis_cluster; fi
if ((want_rs)); then ensure_redis_sentinel; fi
if ((want_ch)); then ensure_clickhouse; fi
if ((want_chcs)); then chc_stop_n2; fi
if ((want_chc)); then ensure_clickhouse_cluster; fi
if ((want_prom)); then ensure_promtool; fi
if ((want_protoc)); then ensure_protoc; fi
if ((want_etcd)); then ensure_etcd; fi
if ((want_etcdk)); then etcd_kill_leader; fi
log "all requested services ready ($((SECONDS - start))s)"
