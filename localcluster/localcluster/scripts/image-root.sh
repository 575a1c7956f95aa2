#!/bin/sh
# Runs inside a fresh mount namespace (image_build.py): the build instance's filesystem. /etc, /opt
# and /usr become writable overlays: the parent AMI's layer over the host's directory below, the
# image's scratch root as the upper layer. Whatever the command writes there lands in the scratch
# root; the host's own directories stay as they were.
# usage: image-root.sh ROOT PARENT WORK -- CMD...
set -eu
root=$1 parent=$2 work=$3
shift 3
[ "$1" = "--" ] && shift
for dir in etc opt usr; do
    mkdir -p "$root/$dir" "$work/$dir" "$parent/$dir"
    mount -t overlay overlay -o "lowerdir=$parent/$dir:/$dir,upperdir=$root/$dir,workdir=$work/$dir" "/$dir"
done
exec "$@"
