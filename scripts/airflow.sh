#!/usr/bin/env bash
# Start/stop a local Airflow as a deployment runs it: PostgreSQL (scripts/postgres.sh), then
# api-server, scheduler, dag-processor and triggerer as separate processes, bound to 127.0.0.1.
#   scripts/airflow.sh start|stop|status
set -euo pipefail
here=$(dirname "$0")
. "$here/env.sh"
pidfile=$AIRFLOW_HOME/airflow.pid
components=(api-server scheduler dag-processor triggerer)
mkdir -p "$AIRFLOW_HOME/logs" "$AIRFLOW__CORE__PLUGINS_FOLDER"

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
healthy() { curl -fsS "http://127.0.0.1:$AIRFLOW_PORT/api/v2/monitor/health" >/dev/null 2>&1; }

case "${1:-}" in
  start)
    if running && healthy; then echo "airflow: already up on http://127.0.0.1:$AIRFLOW_PORT"; exit 0; fi
    bash "$here/postgres.sh" start
    # No default password: the admin's is generated on first start, readable by root only.
    pwfile=$AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE
    if [ ! -f "$pwfile" ]; then
      (umask 077; printf '{"admin": "%s"}\n' "$(head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')" > "$pwfile")
    fi
    "$venvs/airflow/bin/airflow" db migrate >"$AIRFLOW_HOME/logs/migrate.log" 2>&1 \
      || { echo "airflow: db migrate failed, see $AIRFLOW_HOME/logs/migrate.log" >&2; tail -5 "$AIRFLOW_HOME/logs/migrate.log" >&2; exit 1; }
    # pcluster_create's node-cap admission runs one at a time (docs/operations.md, Concurrency).
    "$venvs/airflow/bin/airflow" pools set ultracluster_cluster_admission 1 "node cap admission: one pcluster_create checks and creates at a time" >>"$AIRFLOW_HOME/logs/migrate.log" 2>&1
    # One process group for the four components, so that stop reaches all of them and their children.
    setsid bash -c '
      for c in "$@"; do "$AIRFLOW_BIN" "$c" >"$AIRFLOW_HOME/logs/$c.log" 2>&1 < /dev/null & done
      wait' airflow "${components[@]}" >/dev/null 2>&1 </dev/null &
    echo $! > "$pidfile"
    for _ in $(seq 180); do healthy && break; running || break; sleep 1; done
    healthy || { echo "airflow: not healthy, see $AIRFLOW_HOME/logs/api-server.log" >&2; tail -20 "$AIRFLOW_HOME/logs/api-server.log" >&2; bash "$0" stop; exit 1; }
    # Each api-server worker builds the Task SDK's API (cadwyn's versioned routes, about 3 s here) on
    # its first request under /execution: done now, not by the first task each worker serves. A
    # worker building blocks its loop, so concurrent requests reach the others.
    warm=()
    for _ in $(seq $((2 * ${AIRFLOW__API__WORKERS:-1}))); do
      curl -sS -o /dev/null --max-time 60 "http://127.0.0.1:$AIRFLOW_PORT/execution/health" & warm+=($!)
    done
    wait "${warm[@]}" || true
    echo "airflow: up on http://127.0.0.1:$AIRFLOW_PORT (user admin, password in $pwfile)"
    ;;
  stop)
    if running; then
      pgid=$(cat "$pidfile")
      kill -TERM -- "-$pgid" 2>/dev/null || true
      for _ in $(seq 30); do kill -0 -- "-$pgid" 2>/dev/null || break; sleep 1; done
      kill -KILL -- "-$pgid" 2>/dev/null || true
      echo "airflow: stopped"
    fi
    rm -f "$pidfile"
    bash "$here/postgres.sh" stop
    ;;
  status)
    if running && healthy; then echo "airflow: up on http://127.0.0.1:$AIRFLOW_PORT"; else echo "airflow: down"; fi
    # Each component's heartbeat, as Airflow itself reports it.
    curl -fsS "http://127.0.0.1:$AIRFLOW_PORT/api/v2/monitor/health" 2>/dev/null | "$venvs/airflow/bin/python" -c \
      'import json, sys; [print(f"  {k}: {v[\"status\"]}") for k, v in json.load(sys.stdin).items()]' || true
    bash "$here/postgres.sh" status
    ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
