#!/usr/bin/env bash
# Build the wheel once and submit the job with it. The handlers' dependencies
# (azure-data-tables, azure-identity, msgpack, tenacity, aiohttp) must be on
# the executors too: install them into the cluster's Python environment, or
# ship a packed environment with --archives.
set -euo pipefail
python -m pip wheel --no-deps -w dist .
wheel=$(ls dist/streamstone_py-*.whl | tail -n 1)
spark-submit \
  --properties-file examples/cluster/spark-defaults.conf \
  --py-files "$wheel" \
  --conf spark.executorEnv.STREAMSTONE_ACCOUNT_URL="$STREAMSTONE_ACCOUNT_URL" \
  examples/cluster/job.py \
  run --master yarn --table games --handler shooting_range \
      --input abfss://data@ACCOUNT.dfs.core.windows.net/messages/ \
      --output abfss://data@ACCOUNT.dfs.core.windows.net/results/ \
      --input-format parquet --partitions 64
