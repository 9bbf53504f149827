#!/bin/bash
# cpudist ami build: the builder instance's user data (see ami/README.md). It installs a Python 3.11,
# torch (CPU), MPICH and the cpudist wheel that `cpudist ami build` uploads over SSH, writes a version
# manifest, and powers off on success AND on failure; the console says which step failed.
set -uo pipefail
export DEBIAN_FRONTEND=noninteractive
STEP=start
say() { echo "cpudist-bootstrap: $*"; { echo "cpudist-bootstrap: $*" > /dev/console; } 2>/dev/null || true; }
finish() {
  code=$?
  if [ "$code" -eq 0 ] && [ "$STEP" = done ]; then say "OK"; else say "FAILED at step $STEP (exit $code)"; fi
  sync
  shutdown -h now || poweroff
}
trap finish EXIT
set -e

STEP=packages
if command -v apt-get >/dev/null; then
  apt-get update -q
  apt-get install -y -q ca-certificates curl openssh-server libtcmalloc-minimal4 numactl
  # Nodes notice a vanished laptop within a minute: its run is then stopped on every node.
  printf 'ClientAliveInterval 15\nClientAliveCountMax 4\n' > /etc/ssh/sshd_config.d/90-cpudist.conf
elif command -v dnf >/dev/null; then
  dnf install -y ca-certificates curl openssh-server gperftools-libs numactl
fi

STEP=python
# cpudist needs Python 3.11 exactly; distro Pythons differ (Ubuntu 24.04: 3.12, Amazon Linux: 3.9),
# so uv installs a standalone 3.11 build the same way on every base image.
curl -LsSf https://astral.sh/uv/install.sh | env UV_INSTALL_DIR=/usr/local/bin sh
uv python install 3.11
uv venv --python 3.11 /opt/cpudist

STEP=torch
# The CPU wheel from PyTorch's CPU index: a plain `pip install torch` takes a multi-GB CUDA build.
uv pip install --python /opt/cpudist/bin/python --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

STEP=upload
# `cpudist ami build` uploads the wheel of the cpudist that runs it (not a release fetched by name).
for _ in $(seq 1 360); do
  ready=$(ls /home/*/.cpudist/upload/ready /root/.cpudist/upload/ready 2>/dev/null | head -n 1 || true)
  [ -n "$ready" ] && break
  sleep 5
done
[ -n "$ready" ]
upload=$(dirname "$ready")

STEP=cpudist
uv pip install --python /opt/cpudist/bin/python --constraint <(echo torch==2.13.0) \
  "$(ls "$upload"/cpudist-*.whl | head -n 1)[offline]" mpich
ln -sf /opt/cpudist/bin/cpudist /usr/local/bin/cpudist
rm -rf "$upload"

STEP=manifest
/opt/cpudist/bin/python - <<'PY' > /opt/cpudist/manifest.json
import json, platform
from importlib import metadata
names = ("cpudist", "torch", "transformers", "mpich")
print(json.dumps({"python": platform.python_version(), **{n: metadata.version(n) for n in names}}, indent=2))
PY
cat /opt/cpudist/manifest.json
STEP=done
