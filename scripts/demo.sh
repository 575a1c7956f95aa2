#!/usr/bin/env bash
# `make demo` (after `make up`): run the pipeline on the local UltraCluster and print the results.
set -euo pipefail
. "$(dirname "$0")/env.sh"
"$venvs/airflow/bin/python" "$repo/scripts/demo.py"
echo
echo "demo: clusters left on the local UltraCluster:"
"$venvs/localcluster/bin/pcluster" list-clusters
