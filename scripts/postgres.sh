#!/usr/bin/env bash
# Airflow's metadata database: Debian's PostgreSQL, run by the project on a loopback port.
#   scripts/postgres.sh start|stop|status
# State lives in $ULTRACLUSTER_PG_HOME (default: the local state directory's postgres/):
#   data/          the cluster, owned by the postgres user (PostgreSQL refuses to run as root)
#   password       the generated password of the airflow role, 0600
#   airflow.conn   the SQLAlchemy URL, 0600, read by Airflow through
#                  AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD, so the password is in no environment or log
#   postgres.log   the server's log
set -euo pipefail
. "$(dirname "$0")/env.sh"
pg_home=$ULTRACLUSTER_PG_HOME
port=$ULTRACLUSTER_PG_PORT
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$bin" ] || { echo "postgres: PostgreSQL is not installed (make setup installs Debian's postgresql)" >&2; exit 1; }
as_pg() { runuser -u postgres -- "$@"; }
ready() { "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"; }

case "${1:-}" in
  start)
    if [ -f "$pg_home/data/postmaster.pid" ] && ready; then echo "postgres: already up on 127.0.0.1:$port"; exit 0; fi
    mkdir -p "$pg_home"
    chmod 0755 "$pg_home"
    as_pg test -x "$pg_home" || { echo "postgres: the postgres user cannot reach $pg_home; set ULTRACLUSTER_PG_HOME to a directory whose parents it can search" >&2; exit 1; }
    if [ ! -f "$pg_home/data/PG_VERSION" ]; then
      (umask 077; head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' > "$pg_home/password")
      pwfile=$(mktemp) && chown postgres "$pwfile" && cp "$pg_home/password" "$pwfile"
      rm -rf "$pg_home/data" && install -d -o postgres -g postgres -m 0700 "$pg_home/data"
      as_pg "$bin/initdb" -D "$pg_home/data" -U airflow --pwfile="$pwfile" --auth=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
      rm -f "$pwfile"
      fresh=1
    fi
    password=$(cat "$pg_home/password")
    (umask 077; printf 'postgresql+psycopg2://airflow:%s@127.0.0.1:%s/airflow' "$password" "$port" > "$pg_home/airflow.conn")
    # Loopback TCP only, no Unix socket. synchronous_commit=off: a crash may lose the last
    # transactions of a local deployment, never corrupt it, and commits stop waiting on the disk.
    touch "$pg_home/postgres.log" && chown postgres "$pg_home/postgres.log"
    as_pg "$bin/pg_ctl" -D "$pg_home/data" -l "$pg_home/postgres.log" -w -t 60 start -o \
      "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c max_connections=200 -c synchronous_commit=off" >/dev/null \
      || { echo "postgres: did not start, see $pg_home/postgres.log" >&2; tail -5 "$pg_home/postgres.log" >&2; exit 1; }
    if [ "${fresh:-0}" = 1 ]; then
      PGPASSWORD=$password "$bin/createdb" -h 127.0.0.1 -p "$port" -U airflow airflow
    fi
    echo "postgres: up on 127.0.0.1:$port (data in $pg_home/data)"
    ;;
  stop)
    if [ -f "$pg_home/data/postmaster.pid" ]; then
      as_pg "$bin/pg_ctl" -D "$pg_home/data" -m fast -w stop >/dev/null 2>&1 || true
      echo "postgres: stopped"
    fi
    ;;
  status)
    if ready; then echo "postgres: up on 127.0.0.1:$port"; else echo "postgres: down"; fi
    ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
