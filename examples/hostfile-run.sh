# bash examples/hostfile-run.sh hostfiles/hydra.hostfile
# On-prem: password-less SSH, a health check, then the Intel blog's 4-node run (run on the head node).
set -euo pipefail
HOSTFILE=${1:-hostfiles/hydra.hostfile}
cpudist hosts ssh-setup --hostfile "$HOSTFILE"
cpudist hosts doctor --hostfile "$HOSTFILE"
cpudist run mrpc --np 4 --ppn 1 --hostfile "$HOSTFILE" --data-dir ../shared/data/glue/MRPC \
  --model sentence-transformers/all-MiniLM-L6-v2 --epochs 3
cpudist report
