# fleetserve: the two commands a fresh machine needs are `make quickstart` and `make test`.
.PHONY: setup quickstart test lint

setup:
	bash scripts/setup.sh

# Installs everything, then starts the quickstart fleet (demo model, 2 replicas) in the foreground.
quickstart: setup
	.venv/bin/fleetserve up examples/quickstart.yaml

# Installs everything, then runs the whole test suite. Most tests wait on real child processes (fleets, engines,
# Redis, Prometheus), so 4 workers on 2 cores finish in about a third of the serial time; TEST_WORKERS=0 runs serially.
# The 25 slowest tests are listed at the end: where the suite's time goes.
TEST_WORKERS ?= 4
test: setup
	.venv/bin/ruff check src tests
	.venv/bin/python -m pytest -q -n $(TEST_WORKERS) --durations=25

lint: setup
	.venv/bin/ruff check src tests
