#!/usr/bin/env bash
# `make demo` (after `make up`): run the pipeline on the local UltraCluster with the `ultracluster`
# client (docs/client.md): trigger trn1_bert_pretrain, follow it task by task, print the results.
#   DEMO_CONF       the run conf, a JSON object (default {})
#   DEMO_TIMEOUT_S  stop following after this long (default 1800; the run goes on)
# The admin password: `ultracluster` reads it from the simple auth manager's passwords file that
# env.sh names (AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE, written by scripts/airflow.sh).
set -euo pipefail
. "$(dirname "$0")/env.sh"
conf='{}'
[ -z "${DEMO_CONF:-}" ] || conf=$DEMO_CONF
status=0
printf '%s' "$conf" | "$venvs/airflow/bin/ultracluster" --url "$AIRFLOW__API__BASE_URL" trigger --conf-file - \
  --wait-for-dag 120 --poll-interval 3 --timeout "${DEMO_TIMEOUT_S:-1800}" --results collect_results || status=$?
echo
echo "demo: clusters left on the local UltraCluster:"
"$venvs/localcluster/bin/pcluster" list-clusters
exit "$status"
