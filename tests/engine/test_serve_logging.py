"""An engine's server start survives a logging handler being built on another thread (api/graceful.serve).

Seen in CI: an engine died at start inside uvicorn's `logging.config.dictConfig` with `'StreamHandler' object
has no attribute 'stream'`: dictConfig flushes every registered handler, and `StreamHandler.__init__` registers
itself before it sets its stream. The script below holds a handler in exactly that state while `serve` starts.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import asyncio, logging, os, signal, sys
    from contextlib import asynccontextmanager
    from starlette.applications import Starlette
    from fleetserve.api.graceful import bind_port, serve
    from fleetserve.observe.logs import configure_logging

    configure_logging(sys.argv[1], "engine")
    half_built = logging.StreamHandler.__new__(logging.StreamHandler)
    logging.Handler.__init__(half_built)  # registered, no stream yet: another thread is inside __init__

    @asynccontextmanager
    async def lifespan(app):
        half_built.stream = sys.stderr  # the other thread finishes
        logging.getLogger("uvicorn.error").warning("started")
        asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGINT)  # once it serves
        yield

    sock = bind_port("127.0.0.1", 0)
    serve(Starlette(lifespan=lifespan), lambda: None, sock=sock, host="127.0.0.1", port=sock.getsockname()[1],
          log_level="warning", timeout_graceful_shutdown=1)
    print("stopped")
""")


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_serve_starts_while_a_handler_is_half_built_and_uvicorn_logs_through_ours(log_format):
    done = subprocess.run([sys.executable, "-c", SCRIPT, log_format], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "stopped" in done.stdout
    assert "has no attribute 'stream'" not in done.stderr
    started = [line for line in done.stderr.splitlines() if "started" in line]
    assert len(started) == 1, done.stderr  # uvicorn's own lines reach the process's handler, once
    if log_format == "json":
        assert started[0].startswith("{") and '"component": "engine"' in started[0]
    else:
        assert " engine WARNING started" in started[0]


def test_serve_refuses_a_logging_config():
    from fleetserve.api.graceful import serve

    with pytest.raises(TypeError, match="configure_logging"):
        serve(None, lambda: None, log_config={"version": 1})
