#!/usr/bin/env bash
# Builds the local pretraining dataset once into CACHE_DIR, in the seed's layout:
#   CACHE_DIR/bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128/*_training_*.hdf5 (+ vocab.txt)
#   CACHE_DIR/bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128.tar (that directory, tarred)
# Deterministic (same inputs -> same bytes); reused when the inputs key has not changed.
# Usage: scripts/build_local_dataset.sh CACHE_DIR   (prints the tar path on the last line)
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 CACHE_DIR" >&2
    exit 2
fi
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache_dir="$1"
python_bin="${TRAINING_PYTHON:-$repo_root/.venvs/training/bin/python}"
prepare="$repo_root/include/training/prepare_data.py"
dataset_name="bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128"
prepare_args=(--num_shards 16 --seed 12345 --dupe_factor 2 --vocab_size 8192)

# The corpus is the stdlib of this Python, so its version is an input along with the program,
# its arguments and the versions of the libraries that write the shards.
inputs_key="$(
    {
        sha256sum "$prepare" | cut -d' ' -f1
        echo "${prepare_args[*]}"
        "$python_bin" -c 'import sys, h5py, tokenizers, numpy; print(sys.version, h5py.version.hdf5_version, h5py.__version__, tokenizers.__version__, numpy.__version__)'
    } | sha256sum | cut -d' ' -f1
)"
tar_path="$cache_dir/$dataset_name.tar"
key_file="$cache_dir/$dataset_name.inputs"

if [[ -f "$tar_path" && -f "$key_file" && "$(cat "$key_file")" == "$inputs_key" ]]; then
    echo "$tar_path"
    exit 0
fi

mkdir -p "$cache_dir"
staging="$(mktemp -d "$cache_dir/.build.XXXXXX")"
trap 'rm -rf "$staging"' EXIT
"$python_bin" "$prepare" --output_dir "$staging/$dataset_name" "${prepare_args[@]}" >&2
# Fixed order, owner and mtime so the tar is byte-identical between builds.
tar --sort=name --mtime='@0' --owner=0 --group=0 --numeric-owner \
    -C "$staging" -cf "$staging/$dataset_name.tar" "$dataset_name"

rm -rf "${cache_dir:?}/$dataset_name" "$key_file"
mv "$staging/$dataset_name" "$cache_dir/$dataset_name"
mv "$staging/$dataset_name.tar" "$tar_path"
echo "$inputs_key" > "$key_file"
echo "$tar_path"
