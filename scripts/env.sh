# Sourced by the scripts: the environment of the local deployment (Airflow + local UltraCluster).
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venvs=$repo/.venvs
export LOCAL_ULTRACLUSTER_HOME=${LOCAL_ULTRACLUSTER_HOME:-/var/lib/local-ultracluster}
export AWS_ENDPOINT_URL=${AWS_ENDPOINT_URL:-http://127.0.0.1:5055}
export AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-us-east-1}
export PATH=$venvs/airflow/bin:$PATH
export AIRFLOW_BIN=$venvs/airflow/bin/airflow
export AIRFLOW_HOME=${AIRFLOW_HOME:-$repo/.airflow}
export AIRFLOW_PORT=${AIRFLOW_PORT:-8080}
export AIRFLOW__CORE__DAGS_FOLDER=$repo/dags
# The package is installed (entry point); an empty plugins folder avoids loading it twice.
export AIRFLOW__CORE__PLUGINS_FOLDER=$AIRFLOW_HOME/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES=False
# Metadata on PostgreSQL (scripts/postgres.sh): SQLite locks under a backfill beside running DAGs.
export ULTRACLUSTER_PG_HOME=${ULTRACLUSTER_PG_HOME:-$LOCAL_ULTRACLUSTER_HOME/postgres}
export ULTRACLUSTER_PG_PORT=${ULTRACLUSTER_PG_PORT:-5433}
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD="cat $ULTRACLUSTER_PG_HOME/airflow.conn"
# LocalExecutor on 2 cores: tasks mostly wait on remote work or defer, so 6 slots are enough. Its
# workers fork with the DAGs' modules imported, so a task skips them (ultracluster/executor.py).
export AIRFLOW__CORE__EXECUTOR=ultracluster.executor.PreloadedLocalExecutor
export AIRFLOW__CORE__PARALLELISM=6
# Every AWS hook's session shares the parsed service models (ultracluster/hooks/aws_session.py).
export AIRFLOW__AWS__SESSION_FACTORY=ultracluster.hooks.aws_session.SharedModelsSessionFactory
export AIRFLOW__API__WORKERS=2
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT=$AIRFLOW_PORT
export AIRFLOW__API__BASE_URL=http://127.0.0.1:$AIRFLOW_PORT
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:$AIRFLOW_PORT/execution/
# Closes a deferral race seen in 3.3.2 (field notes; apache/airflow #71580).
export AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL=1
export AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL=5
# How long an idle scheduler loop sleeps (Airflow's default 1 s): after a task ends, in a worker or in
# the triggerer, its successor starts at the next loop (docs/operations.md, "Scheduler settings").
export AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME=${AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME:-0.25}
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=admin:admin
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=$AIRFLOW_HOME/passwords.json
export ULTRACLUSTER_PROFILE=${ULTRACLUSTER_PROFILE:-local}
# The local cluster's compute nodes see this venv as their Neuron venv (/opt/aws_neuron_venv_pytorch).
export LOCAL_UC_TRAINING_VENV=$venvs/training
# Connections for the local UltraCluster, written by `local-ultracluster up`.
if [ -f "$LOCAL_ULTRACLUSTER_HOME/airflow.env" ]; then
  set -a; . "$LOCAL_ULTRACLUSTER_HOME/airflow.env"; set +a
fi
