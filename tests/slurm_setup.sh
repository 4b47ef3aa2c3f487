#!/bin/sh
# What tests/test_slurm.py needs besides the Python packages of `make test`: Debian's SLURM
# (slurmctld, slurmd and the client commands) and munge. Only installs; the tests start their own
# daemons on localhost with a configuration of their own and stop them at the end. Needs root and
# apt; without them the SLURM tests skip, saying why.
set -eu
if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
    && command -v munged >/dev/null 2>&1 && command -v sbatch >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "SLURM is not installed and installing it needs root (apt-get install slurm-wlm munge)" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "SLURM is not installed and there is no apt-get to install it with" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache policy slurm-wlm 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    apt-get update -qq
fi
apt-get install -y -qq slurm-wlm munge
