#!/bin/sh
# Runs inside fresh mount+UTS namespaces (see runtime/nodes.py): makes this process look like a
# cluster node, then execs the daemon so its PID is the one written to PID_FILE.
# usage: ns-exec.sh HOSTNAME HOSTS_FILE SLURM_ETC_DIR PID_FILE [SRC=DST | +LOWERS=DST | @LOWERS=DST ...] -- CMD...
#   SRC=DST bind-mounts SRC at DST; +LOWERS=DST lays the directories LOWERS (colon-separated) over
#   DST (read-only overlayfs: files added, whiteouts hide the host's), so only this namespace sees
#   the change; @LOWERS=DST mounts just LOWERS (at least two) at DST, hiding what DST held.
set -eu
node_name=$1 hosts_file=$2 slurm_etc=$3 pid_file=$4
shift 4
hostname "$node_name"
mount --bind "$hosts_file" /etc/hosts
mkdir -p /etc/slurm
mount --bind "$slurm_etc" /etc/slurm
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    src=${1%%=*} dst=${1#*=}
    case "$src" in
        +*) mount -t overlay overlay -o "lowerdir=${src#+}:$dst" "$dst" ;;
        @*) mount -t overlay overlay -o "lowerdir=${src#@}" "$dst" ;;
        *) mkdir -p "$dst"; mount --bind "$src" "$dst" ;;
    esac
    shift
done
shift
echo $$ > "$pid_file"
exec "$@"
