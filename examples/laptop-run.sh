# bash examples/laptop-run.sh
# From your laptop: a 4-node AWS cluster, the Intel blog's MRPC run on it, the report, and no bill after.
set -euo pipefail
cpudist cluster up --config examples/cluster.toml      # builds the node image first if there is none
cpudist run mrpc --np 4 --ppn 1 --cluster glue4 --data-dir ../shared/data/glue/MRPC \
  --model sentence-transformers/all-MiniLM-L6-v2 --epochs 3   # data and model are staged from here
cpudist report
cpudist cluster down --name glue4 --yes
