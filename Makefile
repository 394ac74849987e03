# The project's commands. Each creates .venv and installs the project on first use.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
PYTEST_ARGS ?=
# Processes for the classic pass (pytest-xdist; whole test files per process, each with its
# own Spark session), files holding a `slow` test first (tests/conftest.py). The Connect pass
# stays in one process: each would start a Connect server.
TEST_WORKERS ?= 2
# The Airflow provider's environment: Airflow without Dagster (their pins can conflict).
AIRFLOW_VENV  ?= .venv-airflow
AIRFLOW_PY     = $(AIRFLOW_VENV)/bin/python
AIRFLOW_STAMP  = $(AIRFLOW_VENV)/.installed

.PHONY: help check-python check-java install install-airflow test test-dagster test-airflow \
        lint format demo demo-maintain dagster airflow \
        bench-store bench-disk bench-cold-start bench-delta-bytes bench-catalog bench-watchdog bench-s3 bench-e2e \
        bench-e2e-connect bench-e2e-partitions \
        bench-maintenance bench-cleanup-workers bench-validation bench-eviction bench-schema \
        bench-dagster-partitions bench-cleanup-backlog bench-fleet bench-fleet-spark bench-ticks bench-failure-ticks bench-snapshots bench-validation-cpu bench-tws \
        bench-tws-task fuzz-spark \
        fuzz-tws soak clean

help:
	@echo "make demo        run the demo job on embedded defaults (local files, SQLite catalog)"
	@echo "make demo-maintain  then snapshots, cleanup (executed) and validation on its stores"
	@echo "make test        run every test (the Dagster environment's, then the Airflow one's)"
	@echo "make install-airflow  the Airflow environment ($(AIRFLOW_VENV)); make test-airflow its tests"
	@echo "make lint        ruff and mypy"
	@echo "make dagster     start the Dagster UI on the demo's stores"
	@echo "make bench-store / bench-catalog / bench-watchdog / bench-s3 / bench-e2e / bench-maintenance / bench-validation"
	@echo "make bench-disk (state larger than memory, 8M keys under 32 MiB)"
	@echo "make bench-cold-start (a cold start streamed to local disk against a whole load)"
	@echo "make bench-eviction / bench-schema / bench-e2e-connect / bench-e2e-partitions / bench-delta-bytes"
	@echo "make bench-dagster-partitions (STATE_BENCH_PARTITIONS=20000,100000)"
	@echo "make bench-fleet  an hourly maintenance cycle at fleet size (STATE_BENCH_FLEET_SIZES=2000,20000)"
	@echo "make bench-fleet-spark  snapshots and validation: 1 worker, default workers, Spark"
	@echo "make bench-ticks  each sensor's tick at fleet size, quiet and after a minute's batches (STATE_BENCH_TICK_SIZES=20000)"
	@echo "make bench-failure-ticks  state_store_failures' ticks after a change, before and now (STATE_BENCH_PARTITIONS=20000,100000)"
	@echo "make bench-snapshots  the snapshot pass at 2,000 stores: CPU per snapshot, wall (SQLite, PostgreSQL)"
	@echo "make bench-validation-cpu  validation's CPU per file and health's wall on bench-snapshots' fleet"
	@echo "make fuzz-spark  thousands of generated streams against Spark's own streaming engine"
	@echo "make fuzz-tws    generated streams through transform_with_state and Spark's transformWithState"
	@echo "make soak        the platform simulation for SOAK_MINUTES (default 60; docs/simulation.md)"

check-python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { \
	  echo "error: '$(PYTHON)' not found. Install Python 3.11+ (e.g. 'apt-get install python3 python3-venv')"; \
	  echo "       or run 'make PYTHON=/path/to/python3.11 ...'"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || { \
	  echo "error: Python 3.11+ is required, '$(PYTHON)' is $$($(PYTHON) -V 2>&1)."; \
	  echo "       Install Python 3.11+ and run 'make PYTHON=/path/to/python3.11 ...'"; exit 1; }
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { \
	  echo "error: '$(PYTHON)' lacks venv/ensurepip. Install it (e.g. 'apt-get install python3-venv')."; exit 1; }

check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "error: Java not found; Spark needs Java 17+."; \
	  echo "       Install it (e.g. 'apt-get install openjdk-17-jre-headless') or set JAVA_HOME."; exit 1; }
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	  [ -n "$$v" ] && [ "$$v" -ge 17 ] || { \
	  echo "error: Java 17+ is required for Spark; found: $$(java -version 2>&1 | head -1)"; \
	  echo "       Install a JDK/JRE 17+ and put it first on PATH or set JAVA_HOME."; exit 1; }

$(STAMP): pyproject.toml | check-python
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# Airflow and its provider (state_runtime_airflow) with the test tools, in their own venv.
$(AIRFLOW_STAMP): pyproject.toml | check-python
	$(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_PY) -m pip install --quiet --upgrade pip
	$(AIRFLOW_PY) -m pip install --quiet -e '.[airflow-dev]'
	@touch $(AIRFLOW_STAMP)

install-airflow: $(AIRFLOW_STAMP)

# Every test: the Dagster environment's passes, then the Airflow environment's.
test: test-dagster test-airflow

# Three passes: every test on classic Spark but those marked `executors` (in TEST_WORKERS
# processes, each with one Spark JVM, local[2,4]; it lists its 40 slowest tests), the
# `executors` ones on local-cluster[2,1,1024] (two real executor JVMs: what they check needs
# partitions to move between executors), then the suites marked `connect` on a Spark Connect
# session on local-cluster (pyspark picks classic or Connect per process; one local Connect
# server per pass). tests/airflow is left out here (no Airflow in this environment):
# test-airflow runs it. A pass whose PYTEST_ARGS select none of its tests (pytest's exit
# status 5) is no failure.
LOCAL_CLUSTER = local-cluster[2,1,1024]
test-dagster: $(STAMP) check-java
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=40 -m "not executors" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	TEST_SPARK_MASTER='$(LOCAL_CLUSTER)' $(PY) -m pytest -m executors $(PYTEST_ARGS) || [ $$? -eq 5 ]
	TEST_SPARK_MASTER='$(LOCAL_CLUSTER)' SPARK_REMOTE=local $(PY) -m pytest -m connect $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The provider's tests (DAG integrity, dag.test() end to end) in the Airflow environment.
test-airflow: $(AIRFLOW_STAMP)
	$(AIRFLOW_PY) -m pytest tests/airflow $(PYTEST_ARGS)

lint: $(STAMP) $(AIRFLOW_STAMP)
	$(VENV)/bin/ruff check state_runtime dagster_project state_runtime_airflow demo tests benchmarks
	$(VENV)/bin/ruff format --check state_runtime dagster_project state_runtime_airflow demo tests benchmarks
	$(VENV)/bin/mypy
	$(AIRFLOW_VENV)/bin/mypy -p state_runtime_airflow

format: $(STAMP)
	$(VENV)/bin/ruff check --fix state_runtime dagster_project state_runtime_airflow demo tests benchmarks
	$(VENV)/bin/ruff format state_runtime dagster_project state_runtime_airflow demo tests benchmarks

demo: $(STAMP) check-java
	$(PY) -m demo

# After `make demo`: a snapshot pass, an executed cleanup and a validation on the demo's stores
# under the demo policy (no retention window: for a finished stream only), then their health
# and history. Reads the demo's catalog (DEMO_CATALOG), never the demo itself.
DEMO_CATALOG ?= $(or $(STATE_CATALOG_URL),sqlite:///demo-output/catalog.db)
STATESTORE = $(VENV)/bin/statestore --catalog-url "$(DEMO_CATALOG)"

demo-maintain: $(STAMP)
	$(STATESTORE) --policy demo maintain --execute
	$(STATESTORE) --policy demo validate
	$(STATESTORE) --policy demo health
	$(STATESTORE) history --by-batch --limit 200

bench-store: $(STAMP)
	$(PY) benchmarks/bench_store.py

bench-disk: $(STAMP)  ## issue 37: 8M keys under a 32 MiB budget, on disk and in memory
	ARROW_DEFAULT_MEMORY_POOL=system MALLOC_MMAP_THRESHOLD_=262144 $(PY) benchmarks/bench_disk.py
	ARROW_DEFAULT_MEMORY_POOL=system MALLOC_MMAP_THRESHOLD_=262144 $(PY) benchmarks/bench_disk.py --memory

bench-cold-start: $(STAMP)  ## issue 37: cold start streamed vs whole, 200k and 2M keys
	$(PY) benchmarks/bench_cold_start.py

bench-delta-bytes: $(STAMP)
	$(PY) benchmarks/bench_delta_bytes.py

# 1M keys against Spark's RocksDB aggregation, then all four engines at 100k keys (Spark's
# Python stateful APIs need minutes per 100k-key batch: 1M keys would take hours).
bench-e2e: $(STAMP) check-java
	$(PY) benchmarks/bench_e2e.py --engines state_runtime,spark-rocksdb --rounds 2
	$(PY) benchmarks/bench_e2e.py --keys 100000 --batches 6 --plot docs/bench-e2e-python.png

# The runtime on Spark Connect against classic Spark, alternating, in one run.
bench-e2e-connect: $(STAMP) check-java
	$(PY) benchmarks/bench_e2e.py --engines state_runtime,state_runtime-connect --rounds 2 \
	  --plot docs/bench-e2e-connect.png

# Spark's default 200 partitions and beyond, on SQLite and PostgreSQL catalogs: batch time,
# bytes, catalog transactions per batch and peak catalog connections against RocksDB.
bench-e2e-partitions: $(STAMP) check-java
	$(PY) benchmarks/bench_e2e.py --keys 100000 --updates 2000 --batches 8 \
	  --partitions 4,200,1000 --engines state_runtime,spark-rocksdb \
	  --catalogs sqlite,postgresql --plot docs/bench-e2e-catalog.png

bench-catalog: $(STAMP)
	$(PY) benchmarks/bench_catalog.py

bench-watchdog: $(STAMP)
	$(PY) benchmarks/bench_watchdog.py

bench-s3: $(STAMP)
	$(PY) benchmarks/bench_s3.py

# The Dagster UI on the demo's stores (http://127.0.0.1:$(DAGSTER_PORT)); Dagster's own
# instance lives in $(DAGSTER_HOME), separate from the state catalog. `dg dev` reads the
# project's [tool.dg] (Dagster 1.13 warns that `dagster dev` is superseded by it).
DAGSTER_HOME ?= $(CURDIR)/demo-output/dagster-home
DAGSTER_PORT ?= 3000

dagster: $(STAMP)
	mkdir -p "$(DAGSTER_HOME)"
	cp dagster_project/dagster.yaml "$(DAGSTER_HOME)/dagster.yaml"
	DAGSTER_HOME="$(DAGSTER_HOME)" $(VENV)/bin/dg dev --host 127.0.0.1 --port $(DAGSTER_PORT)

bench-maintenance: $(STAMP)
	$(PY) benchmarks/bench_maintenance.py

bench-cleanup-workers: $(STAMP)  ## issue 35: a cleanup backlog with 1 worker and the default count
	$(PY) benchmarks/bench_cleanup_workers.py

bench-cleanup-backlog: $(STAMP)  ## issue 35: peak memory of a cleanup against its backlog's size
	$(PY) benchmarks/bench_cleanup_backlog.py

bench-validation: $(STAMP)  ## full vs incremental validation (STATE_BENCH_STORES, default 2000)
	$(PY) benchmarks/bench_validation.py

bench-dagster-partitions: $(STAMP)
	$(PY) benchmarks/bench_dagster_partitions.py

# Issue 35: a fleet built through the runtime's calls (benchmarks/fleet.py), then one hourly
# maintenance cycle and the sensors' ticks timed per size (STATE_BENCH_FLEET_SIZES, default
# 2000,20000; 100000 on demand; STATE_BENCH_FLEET_HOUR batches per store in the hour).
bench-fleet: $(STAMP)
	$(PY) benchmarks/bench_fleet.py --plot docs/bench-fleet.png

bench-snapshots: $(STAMP)
	$(PY) benchmarks/bench_snapshots.py

bench-validation-cpu: $(STAMP)
	$(PY) benchmarks/bench_validation_cpu.py

# Issue 35: each sensor's tick on bench-fleet's fleet, quiet and after a minute's batches (the
# batch events' rule before and now, alternated); STATE_BENCH_TICK_SIZES, default 20000.
bench-ticks: $(STAMP)
	$(PY) benchmarks/bench_ticks.py

# Issue 35: state_store_failures' ticks after a status change at 20,000 and 100,000 partitions
# (STATE_BENCH_PARTITIONS) on an on-disk SQLite Dagster instance, the read before and now.
bench-failure-ticks: $(STAMP)
	$(PY) benchmarks/bench_failure_ticks.py

bench-fleet-spark: $(STAMP) check-java
	$(PY) benchmarks/bench_fleet_spark.py

bench-eviction: $(STAMP)
	$(PY) benchmarks/bench_eviction.py

bench-tws: $(STAMP) check-java
	$(PY) benchmarks/bench_e2e_tws.py

# One partition's transformWithState batches without Spark: the operator's own cost.
bench-tws-task: $(STAMP)
	$(PY) benchmarks/bench_tws_task.py

# Thousands of generated streams against Spark's streaming engine; diverging streams are
# saved as JSON in fuzz-counterexamples/ (turn each into a fixed example test).
fuzz-spark: $(STAMP) check-java
	DIFF_STREAMS=$${DIFF_STREAMS:-2000} DIFF_SAVE=$${DIFF_SAVE:-fuzz-counterexamples} \
	  $(PY) -m pytest tests/runtime/test_differential_vs_spark.py $(PYTEST_ARGS)

# Generated streams through transform_with_state and Spark's transformWithState
# (TWS_FUZZ_STREAMS per processor), and the fixed stream in every processor's both forms
# (docs/transform-with-state.md).
fuzz-tws: $(STAMP) check-java
	TWS_FUZZ_STREAMS=$${TWS_FUZZ_STREAMS:-50} $(PY) -m pytest tests/runtime/test_tws_vs_spark.py \
	  tests/runtime/test_tws_fuzz.py $(PYTEST_ARGS)

# The platform simulation (docs/simulation.md) for SOAK_MINUTES minutes: fresh random runs,
# one soak per CPU, the steps run and each failure printed; the first of each kind shrunk into
# SOAK_OUT. SOAK_ARGS=--postgresql puts the catalogs on PostgreSQL (127.0.0.1:5432);
# SOAK_ARGS="--processes N" runs N soaks at once.
SOAK_MINUTES ?= 60
SOAK_OUT     ?= soak-counterexamples
SOAK_ARGS    ?=

soak: $(STAMP)
	$(PY) -m tests.simulation.soak --minutes $(SOAK_MINUTES) --out $(SOAK_OUT) $(SOAK_ARGS)

bench-schema: $(STAMP)
	$(PY) benchmarks/bench_schema_evolution.py

clean:
	rm -rf $(VENV) $(AIRFLOW_VENV) .pytest_cache .mypy_cache .ruff_cache demo-output soak-counterexamples
