"""Which `spec.engine.args` the built-in engine takes: its own flags, less those the fleet sets for each replica.

Apart from the supervisor so that `validate` checks them without importing the fleet machinery.
"""

from __future__ import annotations

import functools

# the built-in engine's flags the fleet sets for each replica, and where a spec says them instead
FLEET_SETS = {"--model": "spec.model.source", "--host": "the fleet (engines listen on loopback)",
              "--port": "the fleet (each replica its own port)", "--served-model-name": "spec.model.name",
              "--model-version": "spec.model.version", "--namespace": "metadata.namespace",
              "--instance-type": "the fleet's placement", "--replica": "the fleet", "--threads": "spec.engine.threads",
              "--dtype": "spec.model.dtype", "--context-length": "spec.model.contextLength",
              "--block-size": "spec.kvCache.blockSize", "--l1-bytes": "spec.kvCache.l1.maxBytes",
              "--l2-url": "spec.kvCache.l2.url", "--l2-password-file": "the fleet's own Redis",
              "--l2-tenant": "spec.kvCache.l2.tenantUrls", "--drain-timeout": "the fleet (its stop grace)",
              "--orphan-drain": "the fleet", "--stream-keepalive": "spec.router.streamSilenceSeconds",
              "--internal-token-file": "the fleet", "--max-body-bytes": "spec.requestLimits.maxBodyBytes",
              "--max-header-bytes": "spec.requestLimits.maxHeaderBytes", "--log-format": "spec.observability.logFormat",
              "--log-prompts": "spec.observability", "--simulate": "a fleetserve spec serves a model"}


@functools.cache
def _engine_flags() -> frozenset[str]:
    """The flags of `fleetserve engine` for a model (the simulated engine's own left out). Read once: building the
    CLI's command tree takes 160 ms, and `up` asks twice (the CLI, then the supervisor)."""
    import typer.main

    from fleetserve.cli.app import SIMULATED_ONLY, app

    command = typer.main.get_command(app).commands["engine"]  # type: ignore[attr-defined]
    return frozenset(name for p in command.params if p.name not in SIMULATED_ONLY
                     for name in (*p.opts, *p.secondary_opts))


def builtin_args_problem(args) -> str | None:
    """Why `spec.engine.args` cannot go to the built-in engine: a flag it does not have (each replica exited on
    its usage error and `up` failed 11 s later, exit 1, naming nothing of the spec), or one the fleet sets itself
    (`--port 9999`: every replica served where nothing looked, and `up` waited out its startup timeout)."""
    if not args:
        return None
    known = _engine_flags()
    for arg in (str(a) for a in args):
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--"):
            continue  # a flag's value
        if flag in FLEET_SETS:
            return (f"spec.engine.args: {flag} is set by {FLEET_SETS[flag]} for each replica; leave it out of "
                    "engine.args")
        if flag not in known:
            allowed = sorted(k for k in known if k.startswith("--") and k not in FLEET_SETS and k != "--help")
            return f"spec.engine.args: {flag} is not an option of the built-in engine; allowed: {', '.join(allowed)}"
    return None
