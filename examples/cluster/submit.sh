#!/usr/bin/env bash
# Build the wheel and submit the job with it. Everything that differs between
# a cluster and a laptop comes from the environment:
#
#   INPUT, OUTPUT     the messages and the results (required), e.g.
#                     abfss://data@ACCOUNT.dfs.core.windows.net/messages/
#   SPARK_MASTER      yarn (the default), k8s://..., spark://... or local[2]
#   INPUT_FORMAT      parquet (default) or json
#   TABLE             games;  HANDLER  shooting_range;  PARTITIONS  64
#   PYTHON            the Python that builds the wheel (default: python3)
#   SPARK_SUBMIT      default: spark-submit on PATH, else the one that ships
#                     with PySpark in $PYTHON's environment
#   DIST              where the wheel goes (default: dist/ in the repository)
#   PY_FILES          your own handler modules, comma-separated (bank.py), to
#                     ship beside the wheel; then HANDLER=bank:accounts
#   SPARK_LOG_LEVEL   the driver JVM's log level from its first line: warn
#                     (default), info, error; in cluster deploy mode the
#                     driver runs elsewhere and the platform's logging applies
#   ENVIRONMENT       a packed virtualenv with the package's dependencies
#                     (examples/cluster/pack_env.sh makes one), shipped with
#                     --archives; the executors then run its Python
#                     (./environment/bin/python), and the driver $PYTHON, unless
#                     PYSPARK_DRIVER_PYTHON says otherwise. For a cluster master
#                     (yarn, k8s://, spark://, local-cluster), not local[N]
#   EXECUTOR_ENV      names of environment variables to hand to the executors
#                     as spark.executorEnv.NAME, e.g. STREAMSTONE_CONNECTION_STRING
#                     for a local-cluster master against Azurite (its key is
#                     public); never a real secret, which would show in `ps`
#
# Arguments, if any, are added to the job's command line (`--log-level INFO`).
#
# Credentials, never on the command line: STREAMSTONE_ACCOUNT_URL (passed on
# to the executors, which then use their managed identity), or, for a local
# master, STREAMSTONE_CONNECTION_STRING, which the local workers inherit. On
# a cluster, put secrets in the executors' environment with the platform's
# secret store, not in --conf, which Spark shows in its UI and event logs.
#
# Against Azurite on this machine, after `make setup`: run `make azurite` in
# one shell, paste the export line it prints into another, then
#   SPARK_MASTER='local[2]' INPUT=messages.jsonl INPUT_FORMAT=json OUTPUT=results \
#     PYTHON=.venv/bin/python examples/cluster/submit.sh
# With a local master, the driver and its Python workers run $PYTHON unless
# PYSPARK_PYTHON says otherwise.
#
# The wheel is built with `python -m build` (pip install build), which needs
# setuptools and wheel from the package index.
#
# The package's dependencies (azure-data-tables, azure-storage-queue, azure-identity,
# msgpack, tenacity, aiohttp, typing_extensions) must be on the executors too:
# installed into the cluster's Python, or packed by pack_env.sh and shipped
# with ENVIRONMENT (see docs/cluster.md).
#
# Supported Spark versions: 3.5 and 4.x. Runtimes on Spark 3.5 include
# Microsoft Fabric runtime 1.3 and Databricks Runtime 15.4 LTS (14.3 LTS runs
# Python 3.10, older than the package needs);
# check your platform's runtime notes for the Spark version it runs.
set -euo pipefail

: "${INPUT:?set INPUT to the messages (a file or directory Spark can read)}"
: "${OUTPUT:?set OUTPUT to the results directory}"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=${PYTHON:-python3}
dist=${DIST:-$root/dist}

submit=${SPARK_SUBMIT:-$(command -v spark-submit || true)}
if [[ -z $submit ]]; then
  submit=$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit"))')
fi

archives=()
if [[ -n ${ENVIRONMENT:-} ]]; then
  # Each executor unpacks the archive into its working directory as ./environment.
  archives=(--archives "$ENVIRONMENT#environment")
  export PYSPARK_PYTHON=./environment/bin/python
  export PYSPARK_DRIVER_PYTHON=${PYSPARK_DRIVER_PYTHON:-$("$python" -c 'import sys; print(sys.executable)')}
elif [[ ${SPARK_MASTER:-yarn} == local* ]]; then
  export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$("$python" -c 'import sys; print(sys.executable)')}
fi

# The build's own chatter is shown only if the build fails.
log=$(mktemp)
if ! "$python" -m build --wheel --outdir "$dist" "$root" >"$log" 2>&1; then
  cat "$log" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
wheel=$(ls -t "$dist"/streamstone_py-*.whl | head -n 1)
# Spark puts only .zip, .egg and .jar files of --py-files on the Python
# workers' path: the wheel (pure Python, itself a zip) ships as a .zip.
shipped=$dist/streamstone_py.zip
cp "$wheel" "$shipped"

conf=()
for name in ${EXECUTOR_ENV:-}; do
  conf+=(--conf "spark.executorEnv.$name=${!name:?EXECUTOR_ENV names $name, which is not set}")
done
if [[ -n ${STREAMSTONE_ACCOUNT_URL:-} ]]; then
  conf+=(--conf "spark.executorEnv.STREAMSTONE_ACCOUNT_URL=$STREAMSTONE_ACCOUNT_URL"
         --conf "spark.yarn.appMasterEnv.STREAMSTONE_ACCOUNT_URL=$STREAMSTONE_ACCOUNT_URL")
fi

# The driver's JVM logs with the package's file from its first line, so it does
# not open with Spark's start-up INFO lines.
logging="-Dlog4j2.configurationFile=file:$root/spark_driver/log4j2.properties"
logging+=" -Dspark_driver.log.level=${SPARK_LOG_LEVEL:-warn}"

exec "$submit" \
  --master "${SPARK_MASTER:-yarn}" \
  --properties-file "$root/examples/cluster/spark-defaults.conf" \
  --driver-java-options "$logging" \
  --py-files "$shipped${PY_FILES:+,$PY_FILES}" \
  "${archives[@]}" \
  "${conf[@]}" \
  "$root/examples/cluster/job.py" \
  run --table "${TABLE:-games}" --handler "${HANDLER:-shooting_range}" \
      --input "$INPUT" --output "$OUTPUT" \
      --input-format "${INPUT_FORMAT:-parquet}" --partitions "${PARTITIONS:-64}" \
      "$@"
