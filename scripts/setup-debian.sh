#!/bin/sh
# Installs what topolaunch needs on Debian 12 (run as root). Idempotent.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
packages=$(sed -e 's/#.*//' "$here/debian-packages.txt" | tr -s ' \n' ' ')
export DEBIAN_FRONTEND=noninteractive
if [ "$(id -u)" -ne 0 ]; then
  echo "setup-debian.sh: must run as root (it installs Debian packages with apt-get)" >&2
  exit 2
fi
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $packages >/dev/null
# Debian starts munge/slurm services on install where systemd runs; the test cluster runs its
# own private daemons, so the packaged ones must not hold the ports.
for svc in slurmctld slurmd; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    systemctl stop "$svc" || true
  fi
done
echo "setup-debian.sh: packages installed"
