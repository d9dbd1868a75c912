# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test check durations pg-capacity run lint clean system-deps node-deps

install: $(STAMP)

## .venv with an editable install of lockd and resource-proxy, the test extra (pytest, sybil, ...)
## and the docs extra (MkDocs, pinned): about 1-2 minutes the first time, pip naming each package.
$(STAMP): pyproject.toml
	@echo "make install: .venv with lockd, resource-proxy and the test and docs extras (1-2 min the first time)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "make install: upgrading pip"
	$(BIN)/python -m pip install -q --upgrade pip
	@echo "make install: installing the project and its dependencies"
	$(BIN)/python -m pip install --progress-bar off -e '.[test,docs]'
	touch $(STAMP)
	@echo "make install: done; activate with: . $(BIN)/activate"

## System packages the tests need beyond the machine's PostgreSQL: etcd (Debian's etcd-server).
## docker.io (dockerd 20.10, containerd, runc), docker-compose (1.29) and debootstrap: tests/system/demo
## validates docker-compose.yml offline and, as root, starts dockerd, makes stand-in base images
## from Debian packages when no registry is reachable, builds the image and runs the compose demo.
## faketime (libfaketime) skews worker clocks in tests/system/chaos and make chaos.
## chromium (headless) renders the status pages in tests/system/ops.
## jq, sqlite3 and curl: the README's Quick start and console examples (tests/system/readme).
## golang-go (Go 1.19 on bookworm): builds and tests the Go client in clients/go (tests/clients).
system-deps:
	command -v etcd >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server)
	command -v dockerd >/dev/null || test -x /usr/sbin/dockerd || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io)
	command -v docker-compose >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose)
	command -v debootstrap >/dev/null || test -x /usr/sbin/debootstrap || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap)
	command -v faketime >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime)
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)
	command -v jq >/dev/null && command -v sqlite3 >/dev/null && command -v curl >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq sqlite3 curl)
	command -v go >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go)

## The revived-holder demo: lockd + proxy + real worker processes, three scenes, < 30 s.
.PHONY: demo
demo: install
	$(BIN)/python -m lockd.demo

## Benchmarks: table on stdout, bench/results/latest.{json,md,png}; ~22 min on 2 idle cores.
## Knobs: BENCH_SECONDS, BENCH_ROUNDS, BENCH_ONLY=1,5 (see bench/__main__.py).
.PHONY: bench
bench: install pg-capacity
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench

## Fault injection + history checker: one run per store, summary on stdout, JSON report
## in chaos/results/<store>-<seed>.json. CHAOS_STORE=sqlite|postgres|etcd|all, CHAOS_SECONDS per
## store (default 600), CHAOS_SEED (default random), CHAOS_WORKLOAD=counter|transfer|sql|rw|sem|election|objects
## (default counter; objects: fenced writes of one object, frozen holders, a crashing proxy, one run
## whatever CHAOS_STORE says; transfer: two-account transfers through multi-lock leases; sql: plain SQL
## inside fenced_transaction on a database with the fence triggers, no proxy; rw: readers on shared
## locks beside the counter's writers, and writers thawed past their lease after a reader's read;
## sem: semaphore permits writing their slots; election: leaders writing a term log). Every
## workload also writes under neighbour locks whose names contain one another (chaos/near.py).
## Prints the total time up front and a progress line every 30 s. Exit 1 if the checker found a violation.
CHAOS_STORE    ?= all
CHAOS_WORKLOAD ?= counter
CHAOS_SECONDS  ?= 600
CHAOS_SEED     ?=
.PHONY: chaos
chaos: install
	$(BIN)/python -m chaos --store $(CHAOS_STORE) --seconds $(CHAOS_SECONDS) --workload $(CHAOS_WORKLOAD) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))

## Mutation testing of the chaos suite: plant each bug of chaos/mutants in a copy of
## the tree, run chaos there (MUTANT_SECONDS each, default 40; a mutant whose window opens rarely
## runs longer, e.g. batch_partial_raise 2 x), one line per mutant with its violation count (the
## margin), then "undetected: N"; exit 1 if N > 0. MUTANT_ONLY=name,name to pick some,
## MUTANT_SEED (default 4242). About 35 minutes (32 mutants; pg_batch_*: lockd on PostgreSQL with --churn; guard_*: through lockd.guard, --via guard
## or redis-guard; object_*: the objects workload).
## MUTANT_WORKLOAD=counter|transfer|sql|rw|sem|election|objects runs the mutants that workload reaches, under it (default:
## each mutant under its own first workload; sql: the database's fence triggers, plain SQL).
MUTANT_SECONDS  ?= 40
MUTANT_SEED     ?= 4242
MUTANT_ONLY     ?=
MUTANT_WORKLOAD ?=
.PHONY: mutants
mutants: install
	$(BIN)/python -m chaos.mutants --seconds $(MUTANT_SECONDS) --seed $(MUTANT_SEED) $(if $(MUTANT_WORKLOAD),--workload $(MUTANT_WORKLOAD)) $(if $(MUTANT_ONLY),--only $(MUTANT_ONLY))

## Model-based test across primitives (tests/model, docs/development.md): the state machine
## make test runs briefly (a fixed seed per store, ~30 s each), run longer with a random seed per
## store, printed so MODEL_SEED=N repeats it. MODEL_EXAMPLES runs per store (default 300) of
## MODEL_STEPS steps (default 60); MODEL_STORE=sqlite|postgres|etcd|all (default all). About 10 min
## with the defaults on 2 idle cores (etcd's share the longest: each run lets one lease expire).
MODEL_EXAMPLES ?= 300
MODEL_STEPS    ?= 60
MODEL_SEED     ?=
MODEL_STORE    ?= all
.PHONY: model
model: install
	MODEL_EXAMPLES=$(MODEL_EXAMPLES) MODEL_STEPS=$(MODEL_STEPS) $(if $(MODEL_SEED),MODEL_SEED=$(MODEL_SEED),MODEL_RANDOM=1) $(BIN)/python -m pytest tests/model -p no:cacheprovider -rA $(if $(filter-out all,$(MODEL_STORE)),-k $(MODEL_STORE))

## The docs site (mkdocs.yml, docs/): `make docs` builds it into site/ with --strict, so a broken
## link or anchor fails; `make docs-serve` serves it, rebuilt on every edit, at http://127.0.0.1:8000.
.PHONY: docs docs-serve
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:8000

## The whole suite on TEST_WORKERS pytest-xdist workers (default: twice the cores, at most 4:
## most of a test's time is spent waiting on the servers, databases and clusters it started, so
## two workers per core keep both cores busy; more only adds contention). Longest files first, the
## machine-wide tests in their groups (tests/parallel.py). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= $(shell n=$$(( $$(nproc) * 2 )); [ $$n -gt 4 ] && n=4; echo $$n)
test: install node-deps pg-capacity
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --junitxml=.pytest-junit.xml $(PYTEST_ARGS)

## The inner loop (a few minutes): lint, then the tests marked check, which start no etcd
## cluster, container or chaos run: unit and contract tests, the layout rules, the docs' examples.
check: install
	$(BIN)/ruff check lockd resource_proxy tests chaos examples harness bench
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m check $(PYTEST_ARGS)

## Refresh tests/durations.json (the order make test hands files out in) from a run's JUnit file.
durations:
	$(BIN)/python -m tests.durations $(or $(JUNIT),.pytest-junit.xml)

## The machine's PostgreSQL takes a parallel suite's connections: at least 300 of them
## (ALTER SYSTEM, then one restart; nothing when it already does).
pg-capacity:
	@have=$$(psql -h 127.0.0.1 -U postgres -d test -Atc "show max_connections" 2>/dev/null || echo 0); \
	if [ "$$have" -lt 300 ]; then \
	  echo "make pg-capacity: max_connections $$have -> 300 (restarting PostgreSQL)"; \
	  psql -h 127.0.0.1 -U postgres -d test -qc "ALTER SYSTEM SET max_connections = 300" && \
	  pg_ctlcluster --skip-systemctl-redirect "$$(ls /etc/postgresql)" main restart && \
	  for i in $$(seq 30); do pg_isready -h 127.0.0.1 -q && break; sleep 1; done; \
	fi

## Redocly's OpenAPI linter (pinned, from the npm registry; Node 20+), for tests/system/ops/test_openapi_lint.py.
REDOCLY_VERSION := 2.77.0
REDOCLY := .tools/redocly/node_modules/.bin/redocly
node-deps: .tools/redocly/.installed-$(REDOCLY_VERSION)

.tools/redocly/.installed-$(REDOCLY_VERSION):
	command -v npm >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm)
	npm install --prefix .tools/redocly --no-audit --no-fund --silent @redocly/cli@$(REDOCLY_VERSION)
	touch $@

run: install
	$(BIN)/lockd serve

lint: install
	$(BIN)/ruff check lockd resource_proxy tests chaos examples harness bench

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
