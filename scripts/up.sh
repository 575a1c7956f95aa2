#!/usr/bin/env bash
# `make up`: the local UltraCluster's AWS stand-in (moto + buckets + key pair + dataset), then Airflow.
set -euo pipefail
. "$(dirname "$0")/env.sh"
"$venvs/localcluster/bin/local-ultracluster" up --endpoint "$AWS_ENDPOINT_URL" \
  --dataset-tar "$LOCAL_ULTRACLUSTER_HOME/dataset/bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128.tar"
. "$(dirname "$0")/env.sh"   # again: picks up the connections `up` just wrote
bash "$(dirname "$0")/airflow.sh" start
