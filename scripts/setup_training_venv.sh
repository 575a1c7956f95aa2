#!/usr/bin/env bash
# Creates .venvs/training from include/training/requirements.txt (CPU torch 2.13.0).
# Idempotent: does nothing when the venv already matches the pins (stamp = sha256 of the file).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv_dir="${TRAINING_VENV_DIR:-$repo_root/.venvs/training}"
requirements="$repo_root/include/training/requirements.txt"
python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null 2>&1 || python_bin=python3

wanted_stamp="$(sha256sum "$requirements" | cut -d' ' -f1)"
stamp_file="$venv_dir/.requirements.sha256"

if [[ -x "$venv_dir/bin/python" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$wanted_stamp" ]]; then
    echo "training venv up to date: $venv_dir"
    exit 0
fi

if [[ ! -x "$venv_dir/bin/python" ]]; then
    "$python_bin" -m venv "$venv_dir"
fi

# pip, not uv: only pip sees the local CPU torch wheel (find-links); uv would resolve a CUDA build.
"$venv_dir/bin/python" -m pip install --quiet --upgrade pip
"$venv_dir/bin/python" -m pip install --quiet -r "$requirements"

# Refuse a CUDA build sneaking in: it is ~2 GB and useless on the CPU nodes.
torch_version="$("$venv_dir/bin/python" -c 'import torch; print(torch.__version__)')"
if [[ "$torch_version" != "2.13.0+cpu" ]]; then
    echo "expected torch 2.13.0+cpu in $venv_dir, got $torch_version" >&2
    exit 1
fi

echo "$wanted_stamp" > "$stamp_file"
echo "training venv ready: $venv_dir (torch $torch_version)"
