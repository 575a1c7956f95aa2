#!/usr/bin/env bash
# Builds the project's venvs from the repo's own pins. Idempotent: a venv whose inputs have not
# changed since its last build is left alone (a stamp holds the hash of its inputs).
#   .venvs/tools         uv (fast, reproducible installs)
#   .venvs/airflow       requirements.lock + plugins/ (editable) — Airflow, providers, product, test tools
#   .venvs/localcluster  localcluster/ — the pcluster-compatible CLI and moto server
#   .venvs/training      include/training/requirements.txt — torch CPU, transformers (scripts/setup_training_venv.sh)
#   .venvs/pcluster      requirements-pcluster.lock — the real aws-parallelcluster CLI (its schema checks
#                        the rendered config in the tests; it cannot share Airflow's venv)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venvs=$root/.venvs
mkdir -p "$venvs"

python=$(command -v python3.11 || true)
[ -n "$python" ] || { echo "setup: Python 3.11 is required (apt-get install python3 python3-venv on Debian 12)" >&2; exit 1; }

inputs_hash() { cat "$@" | sha256sum | cut -c1-16; }
fresh() { [ -f "$1/.stamp" ] && [ "$(cat "$1/.stamp")" = "$2" ] && [ -x "$1/bin/python" ]; }

if ! [ -x "$venvs/tools/bin/uv" ]; then
  "$python" -m venv "$venvs/tools"
  "$venvs/tools/bin/pip" install -q uv==0.13.9
fi
uv=$venvs/tools/bin/uv
export UV_LINK_MODE=copy
# uv writes no bytecode unless asked (pip does). Without it, where PYTHONDONTWRITEBYTECODE is set (as
# in this machine's shells), every process that imports Airflow, boto3 or moto compiles them from
# source again: `airflow triggerer --help` 4.2 s against 1.9 s. The stamps' "+pyc" rebuilds older venvs.
export UV_COMPILE_BYTECODE=1

stamp="$(inputs_hash requirements.lock plugins/pyproject.toml)+pyc"
if ! fresh "$venvs/airflow" "$stamp"; then
  echo "setup: building .venvs/airflow"
  "$uv" venv -q --allow-existing -p "$python" "$venvs/airflow"
  "$uv" pip sync -q -p "$venvs/airflow/bin/python" requirements.lock
  "$uv" pip install -q --no-deps -p "$venvs/airflow/bin/python" -e plugins
  echo "$stamp" > "$venvs/airflow/.stamp"
fi

stamp="$(inputs_hash localcluster/pyproject.toml localcluster/requirements.lock)+pyc"
if ! fresh "$venvs/localcluster" "$stamp"; then
  echo "setup: building .venvs/localcluster"
  "$uv" venv -q --allow-existing -p "$python" "$venvs/localcluster"
  "$uv" pip sync -q -p "$venvs/localcluster/bin/python" localcluster/requirements.lock
  "$uv" pip install -q --no-deps -p "$venvs/localcluster/bin/python" -e localcluster
  echo "$stamp" > "$venvs/localcluster/.stamp"
fi

stamp="$(inputs_hash requirements-pcluster.lock)+pyc"
if ! fresh "$venvs/pcluster" "$stamp"; then
  echo "setup: building .venvs/pcluster"
  "$uv" venv -q --allow-existing -p "$python" "$venvs/pcluster"
  "$uv" pip sync -q -p "$venvs/pcluster/bin/python" requirements-pcluster.lock
  echo "$stamp" > "$venvs/pcluster/.stamp"
fi

bash scripts/setup_training_venv.sh
echo "setup: venvs ready in $venvs"
