#!/usr/bin/env bash
# Debian packages the local UltraCluster and the tests need. Idempotent: installs only what is missing.
set -euo pipefail
packages=(
  slurmctld slurmd slurm-client slurmdbd munge    # real Slurm 22.05 (Debian 12)
  mariadb-server                                  # accounting DB when a config sets SlurmSettings.Database
  openssh-server openssh-client                   # the head node
  curl ca-certificates                            # the head node fetches data through presigned URLs
  util-linux iproute2 procps psmisc               # unshare/nsenter, ss, pgrep, fuser
  sudo                                            # the nodes' default user has passwordless sudo, as on pcluster
  python3 python3-venv python3-dev                # venvs (Python 3.11 on Debian 12)
  make git
  chromium fonts-liberation                      # the browser tests drive Debian's chromium (Playwright, no download)
  postgresql                                      # Airflow's metadata database (scripts/postgres.sh)
  nodejs                                          # the real pcluster (.venvs/pcluster) needs node for create-cluster
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "apt: all ${#packages[@]} packages present"
  exit 0
fi
echo "apt: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Debian's postinst scripts try to start services; none are wanted: the local cluster starts its own.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "apt: done"
