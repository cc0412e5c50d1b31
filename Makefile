# Two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
NODE_MODULES := azurite/node_modules/.package-lock.json

.PHONY: setup wheel azurite demo demo-outbox demo-queue demo-tokens test test-spark35 test-cluster lint typecheck unit chaos bench bench-quick mutate clean

setup: $(VENV)/.installed $(NODE_MODULES)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "Python 3.11 or newer is needed (found $(PYTHON))"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# setuptools explains editable installs on every run; the layout here needs no warning.
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# npm ci installs exactly the versions in package-lock.json; Azurite needs no install scripts.
$(NODE_MODULES): azurite/package.json azurite/package-lock.json
	npm ci --prefix azurite --ignore-scripts --no-audit --no-fund --loglevel=error
	touch $@

# An Azurite for your own scripts and notebooks: prints the export line, runs until Ctrl-C.
# A new free port and empty storage each time, unless `make azurite LOCATION=dir`
# keeps the data in that directory.
azurite: setup
	$(PY) -m azurite.launcher --serve $(if $(LOCATION),--location $(LOCATION))

demo: setup
	$(PY) -m azurite.launcher -- $(PY) -m spark_driver demo

demo-outbox: setup
	$(PY) -m azurite.launcher -- $(PY) -m spark_driver demo --strategy outbox

# Transfers between accounts, every credit delivered again after retention, without
# tokens and with them: the money created out of nothing (none with tokens).
demo-tokens: setup
	$(PY) -m azurite.launcher -- $(PY) examples/tokens_demo.py

# The workload sent to a queue, a Spark job with a continuous trigger killed halfway
# and started again, then the exactly-once check (PySpark 4: the queue source).
demo-queue: setup
	$(PY) -m azurite.launcher -- $(PY) -m spark_driver.demo_queue

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: setup
	$(PY) -m mypy

# Two workers, whole files each (a file's fixtures, such as its Spark session,
# are made once): most tests wait on Azurite or the JVM, so two workers on two
# cores take about 0.7 of the time of one. `make unit JOBS=1` runs in-process.
JOBS ?= 2
unit: setup
	$(PY) -m pytest $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadfile)

test: lint typecheck unit

# The Spark tests and the demo's exactly-once check on PySpark 3.5 LTS, in a
# second virtualenv (make test runs everything on the newest PySpark).
VENV35 := .venv-spark35
PY35 := $(VENV35)/bin/python

$(VENV35)/.installed: pyproject.toml
	test -x $(PY35) || $(PYTHON) -m venv $(VENV35)
	$(PY35) -m pip install --quiet --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(PY35) -m pip install --quiet -e '.[dev]' 'pyspark>=3.5,<3.6'
	touch $@

test-spark35: $(VENV35)/.installed $(NODE_MODULES)
	$(PY35) -c 'import pyspark, sys; v = pyspark.__version__; print("PySpark", v); sys.exit(not v.startswith("3.5."))'
	$(PY35) -m pytest tests/spark
	$(PY35) -m azurite.launcher -- $(PY35) -m spark_driver demo

# examples/cluster/submit.sh as written, twice, on a local-cluster master (two
# executor JVMs with their own Python workers, on the dependencies that
# pack_env.sh packs once into build/cluster-env/ and --archives ships) against
# Azurite, then the demo's exactly-once check: about two minutes.
test-cluster: setup
	$(PY) -m pytest -m cluster tests/spark/test_cluster.py

# The chaos harness; e.g. `make chaos DURATION=600 THREADS=2 PROCESSES=2 SEED=7`.
# `make chaos MODE=queue`: on Azurite's Queue service, with QueueConsumer workers.
# `make chaos MODE=tokens`: key-to-key messages with tokens, retention, every credit again.
# `make chaos TRACING=1`: the OpenTelemetry SDK behind every worker (broker mode).
DURATION ?= 60
THREADS ?= 2
PROCESSES ?= 2
SEED ?= 1
RESTARTS ?= 2
MODE ?= broker
TRACING ?=
chaos: setup
	$(PY) -m tests.chaos --duration $(DURATION) --threads $(THREADS) \
		--processes $(PROCESSES) --seed $(SEED) --restarts $(RESTARTS) --mode $(MODE) \
		$(if $(TRACING),--tracing)

# Mutation testing of the core modules (tests/mutate/modules.toml) against an
# Azurite of its own, each mutant against the tests that run its lines: the
# mutants no test kills, and each module's score. Verdicts are kept in mutants/
# between runs; `make mutate MUTANTS='glob'` tests those mutants again. See
# docs/reliability.md (about half an hour from nothing on two busy cores).
mutate: setup
	$(PY) -m tests.mutate $(MUTANTS)

# The wheel of the three packages, for your own environment or a cluster.
# setuptools' own lines (two hundred of them) only when the build fails.
wheel: setup
	@mkdir -p dist
	@$(PY) -m build --quiet --wheel --outdir dist . > dist/build.log 2>&1 || \
		{ cat dist/build.log; echo "make wheel: the build failed (its log: dist/build.log)"; exit 1; }
	@ls -1 dist/*.whl

# Every benchmark against one Azurite; writes benchmarks/results/ and docs/benchmarks.md.
bench: setup
	$(PY) benchmarks/run_all.py

bench-quick: setup
	$(PY) benchmarks/run_all.py --quick

clean:
	rm -rf $(VENV) $(VENV35) azurite/node_modules .pytest_cache .mypy_cache .ruff_cache mutants
