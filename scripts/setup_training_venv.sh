#!/usr/bin/env bash
# Creates .venvs/training from include/training/requirements.txt (CPU torch 2.13.0).
# Idempotent: does nothing when the venv already matches the pins (stamp = sha256 of the file).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv_dir="${TRAINING_VENV_DIR:-$repo_root/.venvs/training}"
requirements="$repo_root/include/training/requirements.txt"
# Debian's python by default: the cluster user runs this venv on the nodes, and a venv only
# links to its base interpreter, so that must be readable by every user (pyenv's under /root is not).
if [[ -n "${PYTHON:-}" ]]; then
    python_bin="$PYTHON"
elif /usr/bin/python3.11 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    python_bin=/usr/bin/python3.11
else
    python_bin="$(command -v python3.11 || command -v python3)"
    echo "warning: /usr/bin/python3.11 with venv support missing (apt-get install python3-venv);" \
         "using $python_bin, which other users may not be able to run" >&2
fi

wanted_stamp="$( { sha256sum "$requirements" | cut -d' ' -f1; echo "$python_bin"; } | sha256sum | cut -d' ' -f1)"
stamp_file="$venv_dir/.requirements.sha256"

if [[ -x "$venv_dir/bin/python" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$wanted_stamp" ]]; then
    echo "training venv up to date: $venv_dir"
    exit 0
fi

# A venv built on another interpreter cannot be switched in place: start again.
if [[ -x "$venv_dir/bin/python" && "$(readlink -f "$venv_dir/bin/python")" != "$(readlink -f "$python_bin")" ]]; then
    rm -rf "$venv_dir"
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
