#!/bin/bash
# cpudist ami build: user data of the builder instance. Installs Python, torch (CPU), an MPI
# launcher and cpudist, then powers off; `cpudist ami build` waits for the stop and images it.
set -euxo pipefail
export DEBIAN_FRONTEND=noninteractive
if command -v apt-get >/dev/null; then
  apt-get update -q
  apt-get install -y -q python3 python3-venv python3-pip openssh-server libtcmalloc-minimal4 numactl
elif command -v dnf >/dev/null; then
  dnf install -y python3.11 python3.11-pip openssh-server gperftools-libs numactl
fi
python3 -m venv /opt/cpudist
# The CPU wheel of torch first, from PyTorch's CPU index: a plain `pip install torch` takes a CUDA build.
/opt/cpudist/bin/pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
/opt/cpudist/bin/pip install "cpudist[offline]" mpich
ln -sf /opt/cpudist/bin/cpudist /usr/local/bin/cpudist
touch /var/lib/cpudist-bootstrap.done
shutdown -h now
