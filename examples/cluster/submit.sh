#!/usr/bin/env bash
# Build the wheel once and submit the job with it. The handlers' dependencies
# (azure-data-tables, azure-identity, msgpack, tenacity, aiohttp) must be on
# the executors too: install them into the cluster's Python environment, or
# ship a packed environment with --archives.
#
# Supported Spark versions: 3.5 and 4.x. Runtimes on Spark 3.5 include
# Microsoft Fabric runtime 1.3 and Databricks Runtime 14.3 LTS and 15.4 LTS;
# check your platform's runtime notes for the Spark version it runs.
set -euo pipefail
python -m pip wheel --no-deps -w dist .
wheel=$(ls dist/streamstone_py-*.whl | tail -n 1)
spark-submit \
  --master yarn \
  --properties-file examples/cluster/spark-defaults.conf \
  --py-files "$wheel" \
  --conf spark.executorEnv.STREAMSTONE_ACCOUNT_URL="$STREAMSTONE_ACCOUNT_URL" \
  examples/cluster/job.py \
  run --table games --handler shooting_range \
      --input abfss://data@ACCOUNT.dfs.core.windows.net/messages/ \
      --output abfss://data@ACCOUNT.dfs.core.windows.net/results/ \
      --input-format parquet --partitions 64
