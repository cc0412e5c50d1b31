#!/usr/bin/env bash
# Pack the package's dependencies (pyproject.toml's, and its spark extra's
# pandas and pyarrow, which streams and queue input need on the executors for
# Arrow; from the package index) into a virtualenv archive, for spark-submit --archives: submit.sh ships it
# when ENVIRONMENT names it, and the executors run its Python.
#
#   PYTHON   the Python the virtualenv is made with (default: python3). The
#            archive holds the packages, not the interpreter: its bin/python
#            links to this Python, which every executor must have at the same
#            path and of the driver's minor version (the same image). Where
#            they do not, pack with conda-pack, which takes the interpreter too.
#   OUT      the archive (default: dist/environment.tar.gz)
#
# pyspark is left out: the executors' Spark puts its own on their Python path.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=${PYTHON:-python3}
out=${OUT:-$root/dist/environment.tar.gz}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" -m venv "$work/environment"
"$python" -c '
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
extra = [r for r in project["optional-dependencies"]["spark"] if not r.startswith("pyspark")]
print("\n".join(project["dependencies"] + extra))
' "$root/pyproject.toml" >"$work/requirements.txt"
"$work/environment/bin/python" -m pip install --quiet --disable-pip-version-check \
  -r "$work/requirements.txt"
# The executors install nothing: the installer would be a third of the archive.
"$work/environment/bin/python" -m pip uninstall --quiet --yes pip setuptools
mkdir -p "$(dirname "$out")"
tar -czf "$work/environment.tar.gz" -C "$work/environment" .
mv "$work/environment.tar.gz" "$out"
echo "packed $(wc -l <"$work/requirements.txt") requirements with their dependencies into $out"
