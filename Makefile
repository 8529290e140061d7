# spendbus: the two commands of the quick start are `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install native demo test test-faults test-fuzz check bench bench-compare broker clean prices node-client

# The hot modules compiled with mypyc (pyproject.toml [tool.spendbus.compiled]).
COMPILED := $(shell $(PYTHON) -c "import tomllib; print(' '.join(sum(tomllib.load(open('pyproject.toml', 'rb'))['tool']['spendbus']['compiled'].values(), [])))")
NATIVE_STAMP := $(VENV)/.native-stamp
# touched after a build: an extension whose C did not change is copied with its old time
TOUCH_EXTENSIONS := [ "$$SPENDBUS_PURE" = 1 ] || for m in $(COMPILED:.py=); do touch -c $$m.cpython-*.so; done

# The dependencies first, then the project compiled against them (mypyc reads their
# types; and installed compiled, the editable install knows each group's shared library,
# a top-level module that a later build in place replaces).
$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip 'setuptools>=77' wheel  # build_ext reads pyproject's metadata
	SPENDBUS_PURE=1 $(BIN)/pip install -q -e '.[test,dev,bench]'
	$(BIN)/pip install -q -e . --no-deps --no-build-isolation
	$(TOUCH_EXTENSIONS)
	touch $(STAMP) $(NATIVE_STAMP)

install: $(STAMP)

# Rebuilt in place whenever one of their sources changes, so an extension never runs
# stale code.
$(NATIVE_STAMP): $(COMPILED)
	[ "$$SPENDBUS_PURE" = 1 ] || $(BIN)/python setup.py -q build_ext --inplace
	$(TOUCH_EXTENSIONS)
	touch $(NATIVE_STAMP)

native: $(STAMP) $(NATIVE_STAMP)

# The Kafka broker's jars, fetched once from Maven Central into the cache.
broker: native
	$(BIN)/python -c "from spendbus.stack.broker_jars import ensure_broker_jars; print(ensure_broker_jars())"

demo: broker
	$(BIN)/spendbus demo

# Starts a broker on a free port and the embedded ClickHouse engine for the session,
# runs unit + integration tests and a short fault subset, stops everything.
test: broker
	$(BIN)/python -m pytest -m "not slow" -p no:cacheprovider

# The TypeScript client (clients/node/): its npm dependencies as locked, then tsc into
# clients/node/dist. tests/clients/test_node_client.py does the same when it runs (with
# node and npm installed; it skips, saying so, without them).
node-client:
	cd clients/node && npm ci --no-audit --no-fund && npm run build

# The whole fault set (with the 3-broker cluster's: tests/faults/test_cluster_faults.py),
# with more kill -9 rounds than the subset `make test` runs and
# ClickHouse away for a minute (a few seconds in `make test`).
test-faults: broker
	SPENDBUS_FAULT_KILLS=$${SPENDBUS_FAULT_KILLS:-5} \
	SPENDBUS_CH_DOWN_SECONDS=$${SPENDBUS_CH_DOWN_SECONDS:-60} \
	SPENDBUS_BROKER_DOWN_SECONDS=$${SPENDBUS_BROKER_DOWN_SECONDS:-20} \
	$(BIN)/python -m pytest -m faults -p no:cacheprovider

# The fuzz suite at its larger setting: thousands of hostile requests per surface
# (`make test` runs SPENDBUS_FUZZ_EXAMPLES=200 of them).
test-fuzz: broker
	SPENDBUS_FUZZ_EXAMPLES=$${SPENDBUS_FUZZ_EXAMPLES:-3000} \
	$(BIN)/python -m pytest -m fuzz -p no:cacheprovider

# The gate: ruff's format and lint, then mypy (strict: pyproject.toml) over every package;
# tests/ and bench/ are packages, named from the checkout as pytest imports them. The
# enforcer bench imports its siblings by bare name (SPENDBUS_BENCH_ROOT may put another
# checkout's code first), so bench/ is their root.
BENCH_BY_NAME := bench/bench_enforcer.py bench/enforcer_bench_sidecar.py bench/enforcer_bench_state.py

check: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy schemas runtime aggregator enforcer ingest notify admin reconcile spendbus tests bench \
	  --exclude '^bench/(bench_enforcer|enforcer_bench_.+)\.py$$'
	MYPYPATH=bench $(BIN)/mypy $(BENCH_BY_NAME)

# The shipped price table's generated version, from the two community price maps at their
# pinned versions (schemas/pricing/writer/oracles.py PINS; PyPI only, no other network): the
# wheels are downloaded, their maps read into schemas/data/oracle_prices.json, and
# `spendbus prices import` (schemas/pricing/writer/generate.py) writes the version after the
# marker of schemas/data/prices.yaml. tests/schemas/test_prices_against_oracles.py holds it.
ORACLE_WHEELS := build/oracles
prices: install
	rm -rf $(ORACLE_WHEELS)
	$(BIN)/pip download -q --no-deps -d $(ORACLE_WHEELS) \
	  $$($(BIN)/python -c "from schemas.pricing.writer.oracles import PINS; print(' '.join(n + '==' + v for n, v in PINS.items()))")
	$(BIN)/python -m schemas.pricing.writer.generate --wheels $(ORACLE_WHEELS)

# The benches run on the environment as installed (`make install`, which brings the bench
# extras) and built (`make native`, which rebuilds only extensions older than their
# source): nothing is reinstalled or recompiled for a run.
bench: broker
	@$(BIN)/python -c "import matplotlib" 2>/dev/null || { \
	  echo "make bench: matplotlib is missing from $(VENV) (the bench extras): $(BIN)/pip install -e '.[bench]'" >&2; \
	  exit 1; }
	$(BIN)/python bench/run_all.py

# This tree's counting stage beside BASE's (issue 34): BASE checked out under
# build/bench-compare/, both trees' aggregator and schemas extensions built, the fold and
# pipeline benches alternated between them; one JSON object (bench/records/README.md).
# COMPARE_ARGS passes more, e.g. COMPARE_ARGS="--pipeline-rounds 5 --fold-rounds 11".
bench-compare: broker
	@[ -n "$(BASE)" ] || { echo "make bench-compare: name the base, BASE=<ref>" >&2; exit 1; }
	$(BIN)/python bench/compare.py --base $(BASE) $(COMPARE_ARGS)

clean:
	rm -rf .spendbus build *.egg-info clients/node/dist
	find . -path ./.venv -prune -o -name '*.cpython-*.so' -print -delete
