#!/usr/bin/env bash
# make bench: every benchmark in turn; each prints one line per figure and writes
# bench/results/<name>.{json,md}; bench/results/README.md gathers the tables.
set -euo pipefail
cd "$(dirname "$0")/.."
venvs="$PWD/.venvs"
dataset="${LOCAL_ULTRACLUSTER_HOME:-/var/lib/local-ultracluster}/dataset/bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128"
rm -f bench/results/*.json bench/results/*.md
"$venvs/airflow/bin/python" bench/dag_parse.py
# Benchmarks 2, 3, 4, 6 (and 7, bench/concurrency.py, in the same deployment): whole local runs.
"$venvs/airflow/bin/python" bench/pipeline.py
"$venvs/training/bin/python" bench/input_pipeline.py --data_dir "$dataset"
# Benchmark 8: clusters of 2 to 89 dynamic nodes in its own home and moto; repetitions while they fit.
"$venvs/airflow/bin/python" bench/scale.py --budget-s "${BENCH_SCALE_BUDGET_S:-150}"
# Benchmark 10: a 3-point sweep on one shared cluster against a cluster per point, in its own deployment.
"$venvs/airflow/bin/python" bench/shared_sweep.py
{ echo "# Benchmark results"; echo; cat bench/results/*.md; } > bench/results/README.md.tmp
mv bench/results/README.md.tmp bench/results/README.md
echo "bench: tables in bench/results/README.md"
