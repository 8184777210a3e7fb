#!/bin/sh
# Install what the Slurm tests need (Debian 12): slurm-wlm (slurmctld, slurmd, clients),
# munge, lua5.3. Idempotent and quick when present; without root or network it says why and
# exits 0, and tests/helpers_slurm.py then skips the real-cluster tests with that reason.
set -u
need=""
for pair in slurmctld:slurm-wlm slurmd:slurm-wlm srun:slurm-wlm munged:munge lua5.3:lua5.3; do
    prog=${pair%%:*}
    pkg=${pair#*:}
    if ! command -v "$prog" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$prog" ]; then
        case " $need " in *" $pkg "*) ;; *) need="$need $pkg" ;; esac
    fi
done
if [ -z "$need" ]; then
    echo "install-slurm: slurm-wlm, munge and lua5.3 already installed"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-slurm: not root; cannot install$need (Slurm tests will be skipped)"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-slurm: no apt-get; install$need by hand (Slurm tests will be skipped)"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! timeout 120 apt-get update -q >/tmp/install-slurm.log 2>&1 \
   || ! timeout 300 apt-get install -y -q --no-install-recommends $need >>/tmp/install-slurm.log 2>&1; then
    echo "install-slurm: could not install$need (no network?); see /tmp/install-slurm.log (Slurm tests will be skipped)"
    exit 0
fi
echo "install-slurm: installed$need"
