#!/bin/sh
# What some tests need besides the Python packages of `make test`, from Debian's packages:
#   debian_setup.sh browser   chromium, for tests/test_browser.py (playwright from PyPI brings its
#                             own driver; no browser build is ever downloaded)
#   debian_setup.sh slurm     slurm-wlm and munge, for the SLURM tests (they start their own
#                             daemons, tests/slurm_cluster.py)
# Installs only what is missing; needs root and apt-get. The tests skip, saying why, without it.
set -eu
case "${1:-}" in
browser) commands="chromium" packages="chromium" ;;
slurm) commands="slurmctld slurmd sbatch munged" packages="slurm-wlm munge" ;;
*) echo "usage: $0 browser|slurm" >&2; exit 2 ;;
esac
missing=""
for c in $commands; do
    command -v "$c" >/dev/null 2>&1 || missing="$missing $c"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "$1:$missing not installed, and installing it needs root (apt-get install $packages)" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "$1:$missing not installed, and there is no apt-get to install it with" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Update the package lists only when they do not know the first package yet.
first=${packages%% *}
if ! apt-cache policy "$first" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    apt-get update -qq
fi
# shellcheck disable=SC2086
apt-get install -y -qq $packages
