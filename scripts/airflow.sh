#!/usr/bin/env bash
# Start/stop a local Airflow (api-server, scheduler, dag-processor, triggerer) bound to 127.0.0.1.
#   scripts/airflow.sh start|stop|status
set -euo pipefail
. "$(dirname "$0")/env.sh"
pidfile=$AIRFLOW_HOME/standalone.pid
mkdir -p "$AIRFLOW_HOME" "$AIRFLOW__CORE__PLUGINS_FOLDER"

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
healthy() { curl -fsS "http://127.0.0.1:$AIRFLOW_PORT/api/v2/monitor/health" >/dev/null 2>&1; }

case "${1:-}" in
  start)
    if running && healthy; then echo "airflow: already up on http://127.0.0.1:$AIRFLOW_PORT"; exit 0; fi
    [ -f "$AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" ] || echo '{"admin": "admin"}' > "$AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"
    "$venvs/airflow/bin/airflow" db migrate >"$AIRFLOW_HOME/migrate.log" 2>&1
    # pcluster_create's node-cap admission runs one at a time (docs/operations.md, Concurrency).
    "$venvs/airflow/bin/airflow" pools set ultracluster_cluster_admission 1 "node cap admission: one pcluster_create checks and creates at a time" >>"$AIRFLOW_HOME/migrate.log" 2>&1
    setsid "$venvs/airflow/bin/airflow" standalone >"$AIRFLOW_HOME/standalone.log" 2>&1 < /dev/null &
    echo $! > "$pidfile"
    for _ in $(seq 180); do healthy && break; running || break; sleep 1; done
    healthy || { echo "airflow: not healthy, see $AIRFLOW_HOME/standalone.log" >&2; tail -20 "$AIRFLOW_HOME/standalone.log" >&2; bash "$0" stop; exit 1; }
    echo "airflow: up on http://127.0.0.1:$AIRFLOW_PORT (admin/admin)"
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
    ;;
  status)
    if running && healthy; then echo "airflow: up on http://127.0.0.1:$AIRFLOW_PORT"; else echo "airflow: down"; fi
    ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
