# fleetserve: the two commands a fresh machine needs are `make quickstart` and `make test`.
.PHONY: setup quickstart test lint

setup:
	bash scripts/setup.sh

# Installs everything, then starts the quickstart fleet (demo model, 2 replicas) in the foreground.
quickstart: setup
	.venv/bin/fleetserve up examples/quickstart.yaml

# Installs everything, then runs the whole test suite.
test: setup
	.venv/bin/python -m pytest -q

lint: setup
	.venv/bin/ruff check src tests
