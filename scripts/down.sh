#!/usr/bin/env bash
# `make down`: stop Airflow, every local cluster and daemon, and moto. Nothing is left listening.
set -uo pipefail
. "$(dirname "$0")/env.sh"
bash "$(dirname "$0")/airflow.sh" stop
if [ -x "$venvs/localcluster/bin/local-ultracluster" ]; then
  "$venvs/localcluster/bin/local-ultracluster" down
fi
