# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test run lint clean system-deps

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

## System packages the tests need beyond the machine's PostgreSQL: etcd (Debian's etcd-server).
## docker-compose (1.29) only validates docker-compose.yml offline in tests/demo.
system-deps:
	command -v etcd >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server)
	command -v docker-compose >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose)

## The revived-holder demo: lockd + proxy + real worker processes, three scenes, < 30 s.
.PHONY: demo
demo: install
	$(BIN)/python -m lockd.demo

## Benchmarks (issue 8): table on stdout, bench/results/latest.{json,md,png}; ~10 min.
## Knobs: BENCH_SECONDS, BENCH_ROUNDS, BENCH_ONLY=1,5 (see bench/__main__.py).
.PHONY: bench
bench: install
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

run: install
	$(BIN)/lockd serve

lint: install
	$(BIN)/ruff check lockd resource_proxy tests

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
