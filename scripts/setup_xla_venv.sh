#!/usr/bin/env bash
# Builds the production twin of the Trn1 training venv (torch 2.9.0, torch-xla 2.9.0, transformers
# 4.57.6: include/training/requirements-xla.lock) and links it as .venvs/training-xla.
#
# Once per machine, not per clone: PyPI's torch 2.9.0 is a CUDA build (~7 GB with its nvidia
# wheels), and CI runs in a fresh clone each time. So the venv lives outside the clone, in
# $UC_XLA_VENV_HOME (default /var/cache/ultracluster), named by the hash of the lock and the
# interpreter: every clone with the same lock shares it, a changed lock builds a new one beside it.
# A stamp written last marks a finished build; a flock serialises clones building at once.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lock="$repo_root/include/training/requirements-xla.lock"
link="$repo_root/.venvs/training-xla"
home="${UC_XLA_VENV_HOME:-/var/cache/ultracluster}"
uv="${UV:-$repo_root/.venvs/tools/bin/uv}"
# Debian's python, readable by every user (as for .venvs/training: the cluster user may run it).
python_bin="${PYTHON:-/usr/bin/python3.11}"

[[ -x "$uv" ]] || { echo "setup_xla_venv: $uv missing (scripts/setup_venvs.sh installs it)" >&2; exit 1; }
[[ -x "$python_bin" ]] || { echo "setup_xla_venv: $python_bin missing (apt-get install python3-venv)" >&2; exit 1; }

key="$( { sha256sum "$lock" | cut -d' ' -f1; echo "$python_bin"; } | sha256sum | cut -c1-16)"
venv="$home/training-xla-$key"
mkdir -p "$home" "$(dirname "$link")"

exec 9>"$venv.flock"
flock 9
if [[ -f "$venv/.stamp" && "$(cat "$venv/.stamp")" == "$key" && -x "$venv/bin/python" ]]; then
    echo "xla venv up to date: $venv"
else
    echo "setup: building the XLA training venv in $venv (7 GB: PyPI's torch 2.9.0 brings CUDA wheels)"
    start=$SECONDS
    rm -rf "$venv"
    "$uv" venv -q -p "$python_bin" "$venv"
    # Hard links into uv's cache: the CUDA wheels are not stored twice on the machine. Bytecode: as
    # scripts/setup_venvs.sh (torch and torch_xla import in 8.4 s from source).
    UV_LINK_MODE=hardlink UV_COMPILE_BYTECODE=1 "$uv" pip sync -q -p "$venv/bin/python" "$lock"
    # The lock pins everything; this only proves the set imports together (torch_xla loads torch).
    "$venv/bin/python" -c 'import torch_xla, transformers, h5py' || {
        echo "setup_xla_venv: the venv in $venv does not import torch_xla/transformers/h5py" >&2; exit 1; }
    echo "$key" > "$venv/.stamp"
    echo "setup: XLA training venv built in $((SECONDS - start)) s: $(du -sh "$venv" | cut -f1)"
fi
ln -sfn "$venv" "$link"
echo "xla venv ready: $link -> $venv"
