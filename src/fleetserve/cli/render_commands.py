"""`fleetserve render k8s SPEC -o DIR`: the Kubernetes objects of an endpoint, one file per object.

Registered by `register(app)`. Bad input exits 2 naming the field; warnings (settings that render
differently from the local fleet, or not at all) go to stderr and never change the exit code.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

EXIT_USAGE = 2
LOCAL_ONLY = frozenset({"spec.engine.image", "spec.engine.gpus", "spec.engine.kind", "spec.placement",
                        "spec.metrics.enabled", "spec.model.prefetch"})

render_app = typer.Typer(help="Render an endpoint for a platform (Kubernetes).", no_args_is_help=True)
err = Console(stderr=True, soft_wrap=True, highlight=False)


def _fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    err.print("[red]error:[/red] ", end="")
    err.print(message, markup=False)
    return typer.Exit(code)


@render_app.command("k8s")
def render_k8s(
    spec: Annotated[str, typer.Argument(help="Endpoint spec (fleetserve.io/v1 or HyperPod InferenceEndpointConfig)")],
    output: Annotated[str | None, typer.Option("--output", "-o", help="Directory for one YAML file per object")
                      ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the objects and warnings as JSON on stdout")] = False,
    image: Annotated[str | None, typer.Option(help="fleetserve image (router, built-in engine, model fetch)")] = None,
    prometheus_url: Annotated[str | None, typer.Option(help="Prometheus that KEDA queries")] = None,
    node_class: Annotated[str | None, typer.Option(help="Karpenter NodeClass name (EC2NodeClass)")] = None,
    zone: Annotated[list[str] | None, typer.Option(help="Allowed zone for engine nodes (repeat)")] = None,
    router_replicas: Annotated[int | None, typer.Option(min=1, max=64, help="Router pods")] = None,
    service_account: Annotated[str | None, typer.Option(help="Engine pods' service account (S3 access)")] = None,
    model_pvc: Annotated[str | None, typer.Option(help="Claim holding local-path models (default NAME-model)")
                         ] = None,
) -> None:
    """Write Deployments, Services, KEDA ScaledObjects, Karpenter NodePools, Redis and monitoring objects."""
    from dataclasses import replace

    from fleetserve.k8s.context import RenderOptions
    from fleetserve.k8s.render import render, write
    from fleetserve.spec import SpecError, load_spec

    if output is None and not as_json:
        raise _fail("--output/-o DIR is required (or --json to print the objects)")
    try:
        loaded = load_spec(spec)
    except SpecError as exc:
        raise _fail(str(exc)) from None
    options = RenderOptions()
    given = {"image": image, "prometheus_url": prometheus_url, "node_class": node_class,
             "router_replicas": router_replicas, "service_account": service_account, "model_pvc": model_pvc,
             "zones": tuple(zone) if zone else None}
    options = replace(options, **{k: v for k, v in given.items() if v is not None})
    try:
        rendered = render(loaded.endpoint, options)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    # the local fleet's "no effect here" notes about settings that Kubernetes does honour are left out
    warnings = [str(w) for w in loaded.warnings if w.path not in LOCAL_ONLY] + [str(w) for w in rendered.warnings]
    for w in warnings:
        err.print("[yellow]warning:[/yellow] ", end="")
        err.print(w, markup=False)
    if output is not None:
        try:
            paths = write(rendered, output)
        except OSError as exc:
            raise _fail(f"--output {output}: {exc.strerror or exc}", 1) from None
        if not as_json:
            print(f"{len(paths)} object(s) written to {output}")
    if as_json:
        print(json.dumps({"format": loaded.source_format, "objects": list(rendered.objects),
                          "warnings": warnings}, indent=2))


def register(app: typer.Typer) -> None:
    app.add_typer(render_app, name="render")
