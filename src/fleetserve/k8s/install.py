"""`fleetserve render k8s --install -o DIR`: what a cluster needs before its first Endpoint.

    install_objects(options, install) -> tuple of objects, in apply order

- the `Endpoint` CRD (crd.py, generated from the pydantic spec);
- least-privilege RBAC: a ServiceAccount, a ClusterRole and its binding. The rules are derived, not typed:
  for every kind the operator manages (reconcile.CHILD_KINDS) the verbs its reconcile can emit
  (reconcile.ACTION_VERBS: create, patch, delete) plus get and list (client.list before each pass; watch only
  on Deployments, whose events move the status); on endpoints get/list/watch/patch (kopf's finalizer and
  annotations), endpoints/status patch (client.patch_status) and events create (kopf's event posting).
  pods get/list (the operator reads the engine pods' states for the router: k8s/failing.py) and patch (their
  pod-deletion-cost annotation: k8s/deletion_cost.py), nodes get (their prices, by their labels), no wildcard,
  no watch on Secrets (but get/list on them: it writes the API-key Secret, and RBAC
  cannot narrow a read to the Secrets it owns);
- the operator Deployment (one replica, strategy Recreate: kopf runs standalone, without peering), non-root,
  read-only root filesystem, all capabilities dropped, kopf's liveness endpoint as probe;
- the webhook Service and the ValidatingWebhookConfiguration (CREATE/UPDATE of endpoints, failurePolicy
  Fail). The serving certificate lives in the Secret `fleetserve-operator-webhook-tls` (kubernetes.io/tls);
  its CA reaches the API server either inline (`--webhook-ca-bundle FILE`) or through cert-manager's CA
  injector (the annotation rendered when no bundle is given).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

from fleetserve import __version__
from fleetserve.k8s.client import READ_VERBS
from fleetserve.k8s.context import RenderOptions
from fleetserve.k8s.crd import CRD_NAME, endpoint_crd
from fleetserve.k8s.operator import WEBHOOK_ID, WEBHOOK_PORT
from fleetserve.k8s.reconcile import ACTION_VERBS, CHILD_KINDS, GROUP, OWNER_PLURAL, VERSION
from fleetserve.k8s.render import to_yaml
from fleetserve.k8s.security import TMP_MOUNT, TMP_VOLUME, restricted_container, restricted_pod

NAME = "fleetserve-operator"
WEBHOOK_SECRET = f"{NAME}-webhook-tls"
CERT_DIR = "/etc/fleetserve/webhook"
LIVENESS_PORT = 8081
#: the kinds whose events the operator watches (operator.build_registry: child_changed)
WATCHED = frozenset({("apps/v1", "Deployment"), ("apps/v1", "StatefulSet")})
ORDER = ("Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
         "RoleBinding", "Service", "Deployment", "ValidatingWebhookConfiguration")


@dataclass(frozen=True)
class InstallOptions:
    namespace: str = "fleetserve-system"
    webhook_ca_bundle: bytes | None = None  # PEM; None: cert-manager injects it (Certificate NAMESPACE/NAME-webhook)
    create_namespace: bool = True
    # the namespaces the operator watches (--watch-namespace); empty: all, through a ClusterRole. Given, what it
    # manages in a namespace (Secrets among them) is granted there only, by a Role and RoleBinding each, and the
    # ClusterRole keeps the cluster-scoped kinds (Karpenter NodePools)
    watch_namespaces: tuple[str, ...] = ()


def _labels() -> dict[str, str]:
    return {"app.kubernetes.io/name": "fleetserve", "app.kubernetes.io/component": "operator",
            "app.kubernetes.io/part-of": "fleetserve", "app.kubernetes.io/managed-by": "fleetserve",
            "app.kubernetes.io/version": __version__}


def _selector() -> dict[str, str]:
    return {"app.kubernetes.io/name": "fleetserve", "app.kubernetes.io/component": "operator"}


def rbac_rules(scope: str = "all") -> list[dict]:
    """The rules, derived from what the reconcile and the handlers do. `scope`: "all" (one ClusterRole), or the
    rules of the namespaced kinds ("namespaced": a Role per watched namespace) or of the cluster-scoped ones
    ("cluster": NodePools)."""
    by_group: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for kind in CHILD_KINDS:
        if (scope == "namespaced" and not kind.namespaced) or (scope == "cluster" and kind.namespaced):
            continue
        verbs = {*ACTION_VERBS, *(v for v in READ_VERBS if v != "watch")}
        if (kind.api_version, kind.kind) in WATCHED:
            verbs.add("watch")
        by_group.setdefault((kind.group, tuple(sorted(verbs))), []).append(kind.plural)
    rules = [{"apiGroups": [group], "resources": sorted(set(plurals)), "verbs": list(verbs)}
             for (group, verbs), plurals in sorted(by_group.items())]
    if scope != "namespaced":  # the prices of the nodes the engine pods run on (their instance-type labels)
        rules.append({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]})
    if scope == "cluster":
        return rules
    rules += [
        {"apiGroups": [GROUP], "resources": [OWNER_PLURAL], "verbs": ["get", "list", "patch", "watch"]},
        {"apiGroups": [GROUP], "resources": [f"{OWNER_PLURAL}/status"], "verbs": ["patch"]},
        # ownerReferences with blockOwnerDeletion need it where OwnerReferencesPermissionEnforcement runs
        # (OpenShift, hardened clusters): without it every child's create is Forbidden there
        {"apiGroups": [GROUP], "resources": [f"{OWNER_PLURAL}/finalizers"], "verbs": ["update"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        # the engine pods' states, read for the router: why none can start (failing.py); and their scale-in
        # ranks, the pod-deletion-cost annotation (deletion_cost.py), the only write to them
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]},
    ]
    return rules


def _operator_args(options: RenderOptions) -> list[str]:
    args = ["operator", "--webhook-cert-dir", CERT_DIR, "--liveness", f"http://0.0.0.0:{LIVENESS_PORT}/healthz",
            "--image", options.image, "--prometheus-url", options.prometheus_url, "--node-class",
            options.node_class, "--router-replicas", str(options.router_replicas)]
    for zone in options.zones:
        args += ["--zone", zone]
    if options.service_account:
        args += ["--service-account", options.service_account]
    if options.model_pvc:
        args += ["--model-pvc", options.model_pvc]
    if options.cluster_domain != RenderOptions.cluster_domain:
        args += ["--cluster-domain", options.cluster_domain]
    for key, value in options.monitoring_labels:
        args += ["--monitoring-label", f"{key}={value}"]
    return args


def install_objects(options: RenderOptions | None = None, install: InstallOptions | None = None) -> tuple[dict, ...]:
    options, install = options or RenderOptions(), install or InstallOptions()
    ns = install.namespace

    def meta(name: str, namespaced: bool = True) -> dict:
        return {"name": name, **({"namespace": ns} if namespaced else {}), "labels": _labels()}

    objects: list[dict] = []
    if install.create_namespace:
        objects.append({"apiVersion": "v1", "kind": "Namespace", "metadata": meta(ns, namespaced=False)})
    objects.append(endpoint_crd())
    objects.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(NAME)})
    rbac = "rbac.authorization.k8s.io/v1"
    subjects = [{"kind": "ServiceAccount", "name": NAME, "namespace": ns}]
    watched = install.watch_namespaces
    objects.append({"apiVersion": rbac, "kind": "ClusterRole", "metadata": meta(NAME, namespaced=False),
                    "rules": rbac_rules("cluster" if watched else "all")})
    objects.append({"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": meta(NAME, namespaced=False),
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
                    "subjects": subjects})
    for watched_ns in watched:  # what it manages there, granted there only (Secrets among them)
        role_meta = {**meta(NAME, namespaced=False), "namespace": watched_ns}
        objects.append({"apiVersion": rbac, "kind": "Role", "metadata": role_meta, "rules": rbac_rules("namespaced")})
        objects.append({"apiVersion": rbac, "kind": "RoleBinding", "metadata": dict(role_meta),
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
                        "subjects": subjects})
    objects.append({"apiVersion": "v1", "kind": "Service", "metadata": meta(NAME), "spec": {
        "selector": _selector(),
        "ports": [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]}})
    container = {
        "name": "operator", "image": options.image, "imagePullPolicy": "IfNotPresent",
        "command": ["fleetserve"],
        "args": _operator_args(options) + [arg for n in watched for arg in ("--namespace", n)],
        "ports": [{"name": "webhook", "containerPort": WEBHOOK_PORT, "protocol": "TCP"},
                  {"name": "health", "containerPort": LIVENESS_PORT, "protocol": "TCP"}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 20,
                          "failureThreshold": 3, "timeoutSeconds": 5},
        # this operator serves traffic through a Service (the admission webhook): the pod is its endpoint, and the
        # Deployment is rolled out (`kubectl rollout status`, `kubectl wait`), only once kopf answers /healthz,
        # i.e. once it has started; without it a starting pod was Ready at once and admission reviews met a
        # closed port
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 5,
                           "failureThreshold": 2, "timeoutSeconds": 5},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": restricted_container(),
        "volumeMounts": [{"name": "webhook-tls", "mountPath": CERT_DIR, "readOnly": True}, dict(TMP_MOUNT)],
    }
    objects.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(NAME), "spec": {
        "replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": _selector()},
        "template": {"metadata": {"labels": _labels()}, "spec": {
            "serviceAccountName": NAME, "automountServiceAccountToken": True,
            "securityContext": restricted_pod(),
            "containers": [container],
            "volumes": [{"name": "webhook-tls", "secret": {"secretName": WEBHOOK_SECRET}}, dict(TMP_VOLUME)]}}}})
    client_config: dict = {"service": {"namespace": ns, "name": NAME, "path": f"/{WEBHOOK_ID}", "port": 443}}
    vwc_meta = meta(f"{OWNER_PLURAL}.{GROUP}", namespaced=False)
    if install.webhook_ca_bundle:
        client_config["caBundle"] = base64.b64encode(install.webhook_ca_bundle).decode()
    else:
        vwc_meta["annotations"] = {"cert-manager.io/inject-ca-from": f"{ns}/{NAME}-webhook"}
    objects.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                    "metadata": vwc_meta, "webhooks": [{
                        "name": CRD_NAME, "clientConfig": client_config,
                        "rules": [{"apiGroups": [GROUP], "apiVersions": [VERSION], "operations": ["CREATE", "UPDATE"],
                                   "resources": [OWNER_PLURAL], "scope": "Namespaced"}],
                        # watching some namespaces, it reviews theirs only: elsewhere nobody would reconcile them
                        **({"namespaceSelector": {"matchExpressions": [{
                            "key": "kubernetes.io/metadata.name", "operator": "In", "values": list(watched)}]}}
                           if watched else {}),
                        "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
                        "timeoutSeconds": 10}]})
    objects.sort(key=lambda o: ORDER.index(o["kind"]))
    return tuple(objects)


def file_name(obj: dict) -> str:
    """Unique per object: a Role and its binding per watched namespace share their name, so the namespace is in."""
    where = f"{obj['metadata']['namespace']}-" if obj["kind"] in ("Role", "RoleBinding") else ""
    return f"{ORDER.index(obj['kind']):02d}-{obj['kind'].lower()}-{where}{obj['metadata']['name']}.yaml"


def write(objects: tuple[dict, ...], directory: str | Path) -> list[Path]:
    """One file per object, in apply order (kubectl apply -f DIR applies files in name order)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for obj in objects:
        path = out / file_name(obj)
        path.write_text(to_yaml(obj))
        paths.append(path)
    return paths


class CaBundleError(ValueError):
    """A webhook CA bundle the API server could not use, or must not be given."""


def check_ca_bundle(data: bytes) -> None:
    """The bundle goes inline into a cluster-scoped object every reader can see, and the API server verifies the
    webhook's certificate with it (failurePolicy Fail): a private key given by mistake was published there, and
    any other bytes failed every Endpoint create and update at the TLS handshake."""
    from cryptography import x509

    if b"PRIVATE KEY-----" in data:
        raise CaBundleError("holds a private key; give the CA certificate only (PEM, -----BEGIN CERTIFICATE-----): "
                            "the bundle is published in the ValidatingWebhookConfiguration, which any reader sees")
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise CaBundleError(f"not a PEM certificate (-----BEGIN CERTIFICATE-----): {exc}") from None
    if not certificates:
        raise CaBundleError("holds no PEM certificate (-----BEGIN CERTIFICATE-----)")


def prerequisites(install: InstallOptions) -> list[str]:
    """What must exist before the rendered objects work, and is not rendered: the operator pod mounts the serving
    certificate's Secret, and without a bundle the webhook's CA comes from cert-manager's Certificate."""
    ns = install.namespace
    notes = [f"create the kubernetes.io/tls Secret {ns}/{WEBHOOK_SECRET} (the webhook's serving certificate for "
             f"{NAME}.{ns}.svc) before the operator starts: its pod mounts it"]
    if not install.webhook_ca_bundle:
        notes.append(f"no --webhook-ca-bundle: cert-manager injects the CA from the Certificate {ns}/{NAME}-webhook, "
                     f"which must issue that Secret (dnsNames {NAME}.{ns}.svc); or create the Secret yourself and "
                     "pass its CA with --webhook-ca-bundle (docs/kubernetes.md)")
    return notes
