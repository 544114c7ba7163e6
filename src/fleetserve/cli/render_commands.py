"""`fleetserve render k8s SPEC -o DIR`: the Kubernetes objects of an endpoint, one file per object;
`render k8s --install -o DIR`: the operator's; `fleetserve operator`: the operator itself.

Registered by `register(app)`. Bad input exits 2 naming the field; warnings (settings that render
differently from the local fleet, or not at all) go to stderr and never change the exit code.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated

import typer

from fleetserve.cli.console import err, fail, print_spec_errors, render_refusal

# what `render k8s` and `operator` both take: the rendering options (k8s.context.RenderOptions)
ImageOption = Annotated[str | None, typer.Option(help="fleetserve image (router, built-in engine, model fetch)")]
PrometheusOption = Annotated[str | None, typer.Option(help="Prometheus that KEDA queries")]
NodeClassOption = Annotated[str | None, typer.Option(help="Karpenter NodeClass name (EC2NodeClass)")]
ZoneOption = Annotated[list[str] | None, typer.Option(help="Allowed zone for engine nodes (repeat)")]
RouterReplicasOption = Annotated[int | None, typer.Option(min=1, max=64, help="Router pods")]
ServiceAccountOption = Annotated[str | None, typer.Option(help="Engine pods' service account (S3 access)")]
ModelPvcOption = Annotated[str | None, typer.Option(help="Claim holding local-path models (default NAME-model)")]
ClusterDomainOption = Annotated[str | None, typer.Option(
    help="The cluster's DNS domain, in the Services' names the pods are given (default cluster.local)")]
MonitoringLabelOption = Annotated[list[str] | None, typer.Option(
    help="KEY=VALUE label for the ServiceMonitors and PrometheusRule, as your Prometheus selects them "
         "(kube-prometheus-stack: release=RELEASE); repeat")]

render_app = typer.Typer(help="Render an endpoint for a platform (Kubernetes).", no_args_is_help=True)




@render_app.command("k8s")
def render_k8s(
    spec: Annotated[str | None, typer.Argument(help="Endpoint spec (fleetserve.io/v1 or HyperPod "
                                                    "InferenceEndpointConfig); omit with --install")] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Directory for one YAML file per object")
                      ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the objects and warnings as JSON on stdout")] = False,
    image: ImageOption = None,
    prometheus_url: PrometheusOption = None,
    node_class: NodeClassOption = None,
    zone: ZoneOption = None,
    router_replicas: RouterReplicasOption = None,
    service_account: ServiceAccountOption = None,
    model_pvc: ModelPvcOption = None,
    monitoring_label: MonitoringLabelOption = None,
    cluster_domain: ClusterDomainOption = None,
    install: Annotated[bool, typer.Option("--install", help="Instead of an endpoint: the operator's CRD, RBAC, "
                                                            "Deployment and admission webhook")] = False,
    namespace: Annotated[str | None, typer.Option(help="--install: the operator's namespace (default "
                                                       "fleetserve-system); an endpoint's is its metadata.namespace")
                         ] = None,
    webhook_ca_bundle: Annotated[str | None, typer.Option(help="--install: PEM CA of the webhook's serving "
                                                               "certificate (default: cert-manager injects it)")
                                 ] = None,
    watch_namespace: Annotated[list[str] | None, typer.Option(
        help="--install: a namespace the operator watches (repeat); its rights there come from a Role each "
             "(default: every namespace, through a ClusterRole)")] = None,
) -> None:
    """Write Deployments, Services, KEDA ScaledObjects, Karpenter NodePools, Redis and monitoring objects."""
    from fleetserve.k8s.render import delete_commands, render, rendered_warnings, write
    from fleetserve.spec import SpecError, load_spec

    options = _options(image, prometheus_url, node_class, zone, router_replicas, service_account, model_pvc,
                       monitoring_label, cluster_domain)
    if not install:  # accepted and ignored, they had rendered the spec's namespace without a word
        for flag, value in (("--namespace", namespace), ("--webhook-ca-bundle", webhook_ca_bundle),
                            ("--watch-namespace", watch_namespace)):
            if value is not None:
                raise fail(f"{flag} applies to --install (the operator's objects); an endpoint renders into its "
                           "spec's metadata.namespace")
    namespace = namespace or "fleetserve-system"
    if install:
        if spec is not None:
            raise fail("--install renders the operator, not an endpoint: leave out SPEC")
        if output is None and not as_json:
            raise fail("--output/-o DIR is required (or --json to print the objects)")
        from fleetserve.spec.endpoint import is_dns_label

        if not is_dns_label(namespace):
            raise fail(f"--namespace {namespace!r}: a namespace name (lower-case letters, digits and '-', starting "
                        "and ending with a letter or digit, at most 63)")
        for value in watch_namespace or []:
            if not is_dns_label(value):
                raise fail(f"--watch-namespace {value!r}: a namespace name (lower-case letters, digits and '-', "
                           "starting and ending with a letter or digit, at most 63)")
        _install(options, output, namespace, webhook_ca_bundle, as_json, tuple(dict.fromkeys(watch_namespace or [])))
        return
    if spec is None:
        raise fail("SPEC is required (or --install)")
    try:  # the spec first: a missing file was reported as a missing --output
        loaded = load_spec(spec)
    except SpecError as exc:
        if as_json:
            print_spec_errors(exc)
        raise fail(str(exc)) from None
    if output is None and not as_json:
        raise fail("--output/-o DIR is required (or --json to print the objects)")
    try:
        rendered = render(loaded.endpoint, options)
    except ValueError as exc:
        if as_json:  # stdout had been empty: a tool reading it got nothing to parse
            print_spec_errors(render_refusal(exc))
        raise fail(str(exc)) from None
    warnings = rendered_warnings(loaded, rendered)
    for w in warnings:
        err.print("[yellow]warning:[/yellow] ", end="")
        err.print(w, markup=False)
    if output is not None:
        removed: list[dict] = []
        try:
            paths = write(rendered, output, removed)
        except (NotADirectoryError, FileExistsError) as exc:
            raise fail(f"--output: {exc}") from None
        except OSError as exc:
            raise fail(f"--output {output}: {exc.strerror or exc}", 1) from None
        if not as_json:
            print(f"{len(paths)} object(s) written to {output}")
        if removed:  # on stderr with --json too: stdout is the objects
            err.print(f"[yellow]warning:[/yellow] {len(removed)} object(s) an earlier render of this endpoint made "
                      f"are no longer rendered; their files were removed from {output}, but `kubectl apply` leaves "
                      "them running on a cluster (the operator deletes them itself). Delete them after applying:")
            for line in delete_commands(removed):
                err.print(f"  {line}", markup=False)
    from fleetserve.k8s.secrets_needed import claims_needed, describe, secrets_needed

    needed, claims = secrets_needed(rendered.objects), claims_needed(rendered.objects)
    if (needed or claims) and not as_json:  # their names are hashed under long endpoint names, and nothing said them
        err.print(describe(needed, loaded.endpoint.metadata.namespace, claims) +
                  " (docs/kubernetes.md: their contents)", markup=False)
    if as_json:
        print(json.dumps({"format": loaded.source_format, "objects": list(rendered.objects),
                          "warnings": warnings, "secrets_needed": [{"name": n, "keys": k} for n, k in needed],
                          "claims_needed": claims}, indent=2))


_SUBDOMAIN_RULE = "lower-case letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253"


def _checked(image, prometheus_url, node_class, zone, service_account, model_pvc) -> None:
    """The flags' values as the API server takes them: each of these exited 0 and wrote manifests that
    `kubectl apply` refused (an empty image, `--node-class 'Bad Name!'`, `--prometheus-url notaurl`)."""
    from fleetserve.spec.endpoint import IMAGE_RULE, is_dns_subdomain, is_image_reference, is_label_value

    if image is not None and not is_image_reference(image):
        raise fail(f"--image {image!r}: not an image reference: {IMAGE_RULE}")
    if prometheus_url is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", prometheus_url):
        raise fail(f"--prometheus-url {prometheus_url!r}: an http:// or https:// URL, e.g. "
                    "http://prometheus.monitoring:9090")
    for flag, value in (("--node-class", node_class), ("--service-account", service_account),
                        ("--model-pvc", model_pvc)):
        if value is not None and not is_dns_subdomain(value):
            raise fail(f"{flag} {value!r}: a Kubernetes object name ({_SUBDOMAIN_RULE})")
    for value in zone or []:
        if not is_label_value(value):
            raise fail(f"--zone {value!r}: a label value such as us-west-2a (letters, digits, '-', '_' and '.', "
                        "starting and ending with a letter or digit, at most 63)")


def _monitoring_labels(values: list[str] | None) -> tuple[tuple[str, str], ...] | None:
    from fleetserve.spec.endpoint import LABEL_KEY_RULE, is_label_key, is_label_value

    if not values:
        return None
    out = {}
    for value in values:
        key, sep, label = value.partition("=")
        if not sep or not is_label_key(key) or not is_label_value(label):
            raise fail(f"--monitoring-label {value!r}: KEY=VALUE, a label such as release=kube-prometheus-stack (the "
                       f"key: {LABEL_KEY_RULE}; the value: letters, digits, '-', '_' and '.', at most 63)")
        if key.startswith(("app.kubernetes.io/", "fleetserve.io/")):
            raise fail(f"--monitoring-label {value!r}: {key} is a label fleetserve sets itself")
        out[key] = label
    return tuple(sorted(out.items()))


def _options(image, prometheus_url, node_class, zone, router_replicas, service_account, model_pvc,
             monitoring_label=None, cluster_domain=None):
    from dataclasses import replace

    from fleetserve.k8s.context import RenderOptions

    _checked(image, prometheus_url, node_class, zone, service_account, model_pvc)
    from fleetserve.spec.endpoint import is_dns_subdomain

    if cluster_domain is not None and not is_dns_subdomain(cluster_domain):
        raise fail(f"--cluster-domain {cluster_domain!r}: a DNS domain such as cluster.local ({_SUBDOMAIN_RULE})")

    if cluster_domain is not None and prometheus_url is None:  # the default Prometheus is in the cluster too
        prometheus_url = RenderOptions.prometheus_url.replace(".svc.cluster.local", f".svc.{cluster_domain}")
    given = {"cluster_domain": cluster_domain, "image": image, "prometheus_url": prometheus_url,
             "node_class": node_class,
             "router_replicas": router_replicas, "service_account": service_account, "model_pvc": model_pvc,
             "zones": tuple(zone) if zone else None, "monitoring_labels": _monitoring_labels(monitoring_label)}
    return replace(RenderOptions(), **{k: v for k, v in given.items() if v is not None})


def _install(options, output: str | None, namespace: str, ca_bundle: str | None, as_json: bool,
             watch_namespaces: tuple[str, ...] = ()) -> None:
    from pathlib import Path

    from fleetserve.k8s.install import (
        CaBundleError,
        InstallOptions,
        check_ca_bundle,
        install_objects,
        prerequisites,
        write,
    )

    try:
        bundle = Path(ca_bundle).read_bytes() if ca_bundle else None
    except OSError as exc:
        raise fail(f"--webhook-ca-bundle {ca_bundle}: {exc.strerror}") from None
    if bundle is not None:
        try:
            check_ca_bundle(bundle)
        except CaBundleError as exc:
            raise fail(f"--webhook-ca-bundle {ca_bundle}: {exc}") from None
    install = InstallOptions(namespace=namespace, webhook_ca_bundle=bundle, watch_namespaces=watch_namespaces)
    objects = install_objects(options, install)
    notes = prerequisites(install)
    if output is not None:
        if Path(output).exists() and not Path(output).is_dir():
            raise fail(f"--output: {output} is a file; give a folder for the manifests")
        try:
            paths = write(objects, output)
        except OSError as exc:
            raise fail(f"--output {output}: {exc.strerror or exc}", 1) from None
        if not as_json:
            print(f"{len(paths)} object(s) written to {output}")
    if as_json:
        print(json.dumps({"objects": list(objects), "prerequisites": notes}, indent=2))
        return
    for note in notes:
        err.print(f"note: {note}", markup=False)


def operator(
    namespace: Annotated[list[str] | None, typer.Option(help="Watch only this namespace (repeat; default: all)")
                         ] = None,
    liveness: Annotated[str, typer.Option(help="kopf's liveness endpoint")] = "http://0.0.0.0:8081/healthz",
    webhook_cert_dir: Annotated[str | None, typer.Option(help="Directory with tls.crt and tls.key: serve the "
                                                              "validating admission webhook")] = None,
    webhook_port: Annotated[int, typer.Option(min=1, max=65535)] = 9443,
    image: ImageOption = None,
    prometheus_url: PrometheusOption = None,
    node_class: NodeClassOption = None,
    zone: ZoneOption = None,
    router_replicas: RouterReplicasOption = None,
    service_account: ServiceAccountOption = None,
    model_pvc: ModelPvcOption = None,
    monitoring_label: MonitoringLabelOption = None,
    cluster_domain: ClusterDomainOption = None,
) -> None:
    """Run the Kubernetes operator: keep every Endpoint resource's objects as `render k8s` makes them."""
    try:
        import kopf  # noqa: F401
        import kubernetes  # noqa: F401

        from fleetserve.k8s.operator import run
    except ImportError as exc:
        raise fail(f"the operator needs the k8s extra (pip install 'fleetserve[k8s]'): {exc}", 1) from None
    options = _options(image, prometheus_url, node_class, zone, router_replicas, service_account, model_pvc,
                       monitoring_label, cluster_domain)
    from fleetserve.spec.endpoint import is_dns_label

    for value in namespace or []:  # before the cluster's credentials: they had been the error said instead
        if not is_dns_label(value):
            raise fail(f"--namespace {value!r}: a namespace name (lower-case letters, digits and '-', starting and "
                       "ending with a letter or digit, at most 63)")
    if liveness and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", liveness):
        raise fail(f"--liveness {liveness!r}: an http:// URL kopf serves its liveness probe at, e.g. "
                   "http://0.0.0.0:8081/healthz")
    if webhook_cert_dir is not None:
        missing = [f for f in ("tls.crt", "tls.key") if not (Path(webhook_cert_dir) / f).is_file()]
        if missing:
            raise fail(f"--webhook-cert-dir {webhook_cert_dir}: no {' or '.join(missing)} there (the webhook "
                        "serves with tls.crt and tls.key, as a kubernetes.io/tls Secret mounts them)", 2)
    run(client=_kube_client(), options=options, namespaces=tuple(namespace or ()), liveness=liveness or None,
        webhook_cert_dir=webhook_cert_dir, webhook_port=webhook_port)


def _kube_client():
    """The cluster's client, or one line saying why there is none (it was two chained tracebacks)."""
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    from fleetserve.k8s.client import KubeClient

    try:
        return KubeClient()
    except ConfigException as exc:
        raise fail(f"no Kubernetes credentials: not in a pod with a service account, and no usable kubeconfig "
                    f"(KUBECONFIG={os.environ.get('KUBECONFIG', '')!r}, else ~/.kube/config): {exc}", 2) from None
    except HTTPError as exc:
        raise fail(f"cannot reach the Kubernetes API server: {exc}", 1) from None


def register(app: typer.Typer) -> None:
    app.add_typer(render_app, name="render")
    app.command("operator")(operator)
