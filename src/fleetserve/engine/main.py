"""`fleetserve engine`: resolve the model, load it, then serve (so /health answers only when ready)."""

from __future__ import annotations

import logging

import uvicorn

from fleetserve.engine.runner import ModelRunner
from fleetserve.engine.server import Engine, EngineSettings, build_app
from fleetserve.engine.sources import resolve_source
from fleetserve.observe.metrics import ModelIdentity


def run_engine(
    *,
    model: str,
    host: str,
    port: int,
    served_model_name: str | None,
    model_version: str = "1",
    namespace: str = "default",
    instance_type: str = "local",
    replica: str = "r0",
    threads: int | None = None,
    dtype: str = "auto",
    context_length: int | None = None,
    max_tokens_default: int = 512,
    max_waiting: int = 256,
    revision: str | None = None,
) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s engine[" + replica + "] %(levelname)s %(message)s")
    path = resolve_source(model, revision)
    runner = ModelRunner(path, dtype=dtype, threads=threads, context_length=context_length)
    name = served_model_name or path.name
    identity = ModelIdentity(namespace, name, model_version, instance_type, replica)
    engine = Engine(runner, EngineSettings(name, identity, max_tokens_default, max_waiting))
    logging.getLogger(__name__).info("serving %s (%s) on http://%s:%d", name, path, host, port)
    uvicorn.run(build_app(engine), host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
