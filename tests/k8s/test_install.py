"""The generated CRD (structural, valid as apiextensions.k8s.io/v1, agreeing with pydantic) and the
`render k8s --install` objects (RBAC derived from the reconcile's verbs, all valid in strict mode)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from fleetserve.cli.app import app
from fleetserve.k8s.crd import endpoint_crd, structural_problems
from fleetserve.k8s.install import InstallOptions, install_objects, rbac_rules
from fleetserve.k8s.reconcile import ACTION_VERBS, CHILD_KINDS
from tests.k8s.test_render import FULL
from tests.k8s.validate import KUBERNETES_VERSION, strict

ROOT = Path(__file__).resolve().parents[2]
OURS = [p for p in sorted((ROOT / "examples").glob("*.yaml"))
        if yaml.safe_load(p.read_text()).get("apiVersion") == "fleetserve.io/v1"]


def _schema() -> dict:
    return endpoint_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _nullable(schema):
    """OpenAPI's nullable as JSON schema (type + null) for a plain validator."""
    if isinstance(schema, dict):
        schema = {k: _nullable(v) for k, v in schema.items()}
        if schema.pop("nullable", False) and "type" in schema:
            schema["type"] = [schema["type"], "null"]
    elif isinstance(schema, list):
        schema = [_nullable(s) for s in schema]
    return schema


def _errors(doc: dict) -> list[str]:
    schema = _nullable(strict(_schema()))
    schema["properties"]["metadata"] = {"type": "object"}
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]


def test_the_crd_is_structural_and_valid():
    crd = endpoint_crd()
    assert structural_problems(_schema()) == []
    assert kubernetes_validate.validate(crd, KUBERNETES_VERSION, strict=True)
    text = json.dumps(crd)
    assert "$ref" not in text and "anyOf" not in text
    # Kubernetes objects passed through as given: placement.nodeAffinity, model.volume, engine.probes,
    # engine.resources, engine.envFrom values, pod.initContainers/volumes/volumeMounts items, pod.securityContext
    assert text.count("x-kubernetes-preserve-unknown-fields") == 9
    node = _schema()["properties"]["spec"]["properties"]["placement"]["properties"]["nodeAffinity"]
    assert node["x-kubernetes-preserve-unknown-fields"] is True


def test_structural_problems_are_found():
    assert "x: no type" in structural_problems({"type": "object", "properties": {"x": {}}})
    assert any("$ref" in p for p in structural_problems({"$ref": "#/a", "type": "object"}))
    assert any("boolean" in p for p in structural_problems({"type": "number", "exclusiveMinimum": 0}))


@pytest.mark.parametrize("path", OURS, ids=lambda p: p.name)
def test_examples_pass_the_crd_schema(path):
    assert _errors(yaml.safe_load(path.read_text())) == []


def test_the_schema_rejects_what_pydantic_rejects_by_type():
    assert _errors(FULL) == []
    bad = copy.deepcopy(FULL)
    bad["spec"]["replicas"] = "two"
    bad["spec"]["routing"]["strategy"] = "random"
    bad["spec"]["autoscaling"]["pollingInterval"] = 0  # gt=0 -> exclusiveMinimum
    bad["spec"]["unknown"] = 1
    errors = " | ".join(_errors(bad))
    for part in ("spec.replicas", "spec.routing.strategy", "spec.autoscaling.pollingInterval", "'unknown'"):
        assert part in errors, errors


def test_rbac_is_derived_from_the_reconcile_verbs():
    rules = rbac_rules()
    granted = {(g, r): set(rule["verbs"]) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    for kind in CHILD_KINDS:
        verbs = granted[(kind.group, kind.plural)]
        assert set(ACTION_VERBS) | {"get", "list"} <= verbs
        assert ("watch" in verbs) == (kind.kind in ("Deployment", "StatefulSet"))  # status follows their pods
    assert granted[("fleetserve.io", "endpoints/status")] == {"patch"}
    # blockOwnerDeletion in the children's ownerReferences: OwnerReferencesPermissionEnforcement asks for it
    assert granted[("fleetserve.io", "endpoints/finalizers")] == {"update"}
    flat = json.dumps(rules)
    assert "*" not in flat
    # read for the router (k8s/failing.py); patched for their deletion cost only (k8s/deletion_cost.py)
    assert granted[("", "pods")] == {"get", "list", "patch"}
    assert granted[("", "nodes")] == {"get"}  # their prices, by their labels; cluster-scoped, so in the ClusterRole
    assert any("nodes" in rule["resources"] for rule in rbac_rules("cluster"))
    assert not any("nodes" in rule["resources"] for rule in rbac_rules("namespaced"))
    assert ("", "secrets") in granted and "watch" not in granted[("", "secrets")]


def test_install_objects_validate_strictly():
    objects = install_objects()
    kinds = [o["kind"] for o in objects]
    assert kinds == ["Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                     "Service", "Deployment", "ValidatingWebhookConfiguration"]
    for obj in objects:
        assert kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    webhook = objects[-1]
    assert webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert webhook["webhooks"][0]["clientConfig"]["service"]["path"] == "/validate-endpoint"
    bundle = install_objects(install=InstallOptions(webhook_ca_bundle=b"PEM", create_namespace=False))
    assert bundle[-1]["webhooks"][0]["clientConfig"]["caBundle"] == "UEVN"
    assert "Namespace" not in [o["kind"] for o in bundle]
    pod = objects[6]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["serviceAccountName"] == "fleetserve-operator"


def test_the_operator_is_ready_only_once_kopf_answers_where_it_was_told_to_listen():
    """The pod is the webhook Service's endpoint: Ready at once, admission reviews met a closed port."""
    pod = next(o for o in install_objects() if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    liveness = container["args"][container["args"].index("--liveness") + 1]
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "health")
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] == "health" and liveness.endswith(f":{port}{get['path']}"), probe


def test_cli_install_writes_the_files(tmp_path):
    result = CliRunner().invoke(app, ["render", "k8s", "--install", "-o", str(tmp_path), "--image", "reg/fs:1"])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0].startswith("00-namespace-") and names[-1].startswith("09-validatingwebhookconfiguration-")
    deployment = yaml.safe_load(next(tmp_path.glob("08-deployment-*")).read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "reg/fs:1" and container["args"][0] == "operator"
    assert "--image" in container["args"]
    both = CliRunner().invoke(app, ["render", "k8s", str(ROOT / "examples" / "quickstart.yaml"), "--install",
                                    "-o", str(tmp_path)])
    assert both.exit_code == 2


def test_cli_install_refuses_a_ca_bundle_that_is_no_certificate_and_says_what_must_exist(tmp_path):
    """A private key given as --webhook-ca-bundle was published base64 in a cluster-scoped object; any other bytes
    broke every Endpoint create at the TLS check (failurePolicy Fail). `--json` was refused without -o, and nothing
    said that the serving certificate's Secret (and, without a bundle, cert-manager's Certificate) must exist."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "webhook")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    files = {"ca.pem": pem, "key.pem": key_pem, "both.pem": pem + key_pem, "junk.pem": b"garbage\n"}
    for file, data in files.items():
        (tmp_path / file).write_bytes(data)

    def install(*args):
        return CliRunner().invoke(app, ["render", "k8s", "--install", *args])

    for file, says in (("key.pem", "holds a private key"), ("both.pem", "holds a private key"),
                       ("junk.pem", "not a PEM certificate")):
        r = install("-o", str(tmp_path / file[:-4]), "--webhook-ca-bundle", str(tmp_path / file))
        assert r.exit_code == 2 and f"--webhook-ca-bundle {tmp_path / file}: {says}" in r.stderr, r.output
        assert not (tmp_path / file[:-4]).exists()
    r = install("-o", str(tmp_path / "ok"), "--webhook-ca-bundle", str(tmp_path / "ca.pem"))
    assert r.exit_code == 0 and "fleetserve-operator-webhook-tls" in r.stderr and "cert-manager" not in r.stderr
    r = install("--json")
    assert r.exit_code == 0, r.output
    printed = json.loads(r.stdout)
    assert printed["objects"][-1]["kind"] == "ValidatingWebhookConfiguration"
    first, second = printed["prerequisites"]
    assert "Secret fleetserve-system/fleetserve-operator-webhook-tls" in first
    assert "Certificate fleetserve-system/fleetserve-operator-webhook," in second


def test_cli_operator_help():
    result = CliRunner().invoke(app, ["operator", "--help"])
    assert result.exit_code == 0 and "--webhook-cert-dir" in result.output


def test_an_operator_watching_some_namespaces_is_granted_rights_there_only(tmp_path):
    """The install was cluster-wide only: read and write on every Secret of every namespace, kube-system included,
    even for an operator told to watch one namespace."""
    result = CliRunner().invoke(app, ["render", "k8s", "--install", "-o", str(tmp_path), "--watch-namespace",
                                      "team-a", "--watch-namespace", "team-b"])
    assert result.exit_code == 0, result.output
    objects = [yaml.safe_load(p.read_text()) for p in sorted(tmp_path.iterdir())]
    for obj in objects:
        assert kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    (cluster_role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    cluster_wide = {r for rule in cluster_role["rules"] for r in rule["resources"]}
    # cluster-scoped kinds only (NodePools; nodes, read for their prices): no Secrets, no pods anywhere
    assert cluster_wide == {"nodepools", "nodes"}
    roles = {o["metadata"]["namespace"]: o for o in objects if o["kind"] == "Role"}
    bindings = {o["metadata"]["namespace"]: o for o in objects if o["kind"] == "RoleBinding"}
    assert set(roles) == set(bindings) == {"team-a", "team-b"}
    granted = {r for rule in roles["team-a"]["rules"] for r in rule["resources"]}
    assert {"secrets", "configmaps", "deployments", "pods", "endpoints", "endpoints/status", "events"} <= granted
    assert bindings["team-b"]["subjects"][0]["name"] == "fleetserve-operator"
    (operator,) = [o for o in objects if o["kind"] == "Deployment"]
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--namespace"] == ["team-a", "team-b"]
    (webhook,) = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    assert webhook["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a", "team-b"]
    bad = CliRunner().invoke(app, ["render", "k8s", "--install", "--json", "--watch-namespace", "Team A"])
    assert bad.exit_code == 2 and "--watch-namespace" in bad.output


def test_operator_flags_are_checked_before_the_clusters_credentials():
    """`operator --namespace 'Bad NS'` and `--liveness notaurl` were answered with the missing kubeconfig."""
    for args, flag in ((["--namespace", "Bad NS"], "--namespace"), (["--liveness", "notaurl"], "--liveness")):
        result = CliRunner().invoke(app, ["operator", *args])
        assert result.exit_code == 2 and flag in result.output, result.output
