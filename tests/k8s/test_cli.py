"""`fleetserve render k8s`: files, JSON, warnings on stderr only, exit 2 naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fleetserve.cli.app import app

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, env=None):
    return CliRunner().invoke(app, list(args), env=env)


def test_hyperpod_example_writes_the_core_objects(tmp_path):
    result = _run("render", "k8s", str(ROOT / "examples" / "hyperpod.yaml"), "-o", str(tmp_path))
    assert result.exit_code == 0, result.output
    kinds = {p.name.split("-")[1] for p in tmp_path.iterdir()}
    assert {"deployment", "service", "scaledobject", "nodepool"} <= kinds
    for line in result.stderr.splitlines():
        assert line.startswith(("warning: ", "note: create before applying")), line


def test_json_output(tmp_path):
    result = _run("render", "k8s", str(ROOT / "examples" / "autoscaling.yaml"), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert any(o["kind"] == "ScaledObject" for o in data["objects"])


def test_bad_spec_exits_2_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: x}\n"
                   "spec: {model: {source: builtin:smollm2-135m}, replicas: -1}\n")
    result = _run("render", "k8s", str(bad), "-o", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "spec.replicas" in result.stderr


def test_output_is_required():
    result = _run("render", "k8s", str(ROOT / "examples" / "quickstart.yaml"))
    assert result.exit_code == 2 and "--output" in result.stderr


def test_an_output_that_is_a_file_and_a_spec_that_is_not_text_exit_2(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    result = _run("render", "k8s", str(ROOT / "examples" / "quickstart.yaml"), "-o", str(afile))
    assert result.exit_code == 2 and "is a file" in result.stderr and afile.read_text() == "mine"
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: caf\xe9}\n")
    result = _run("validate", str(latin1))
    assert result.exit_code == 2 and "not UTF-8" in result.stderr
    result = _run("model", "prepare", "builtin:smollm2-135m", env={"FLEETSERVE_HOME": str(afile)})
    assert result.exit_code == 2 and "Not a directory" in result.stderr


def test_the_init_container_downloads_hub_models_and_a_failed_download_is_exit_2(tmp_path):
    """The init container ran `model prepare hf:...`, which reads only the local cache: on a fresh pod every
    hf: and catalog: model failed to load. It asks for `--download` now; a Hub it cannot reach is exit 2."""
    from tests.helpers import fleetserve

    result = _run("render", "k8s", str(ROOT / "examples" / "autoscaling.yaml"), "--json")
    objects = json.loads(result.stdout)["objects"]
    inits = [c for o in objects if o["kind"] == "Deployment"
             for c in o["spec"]["template"]["spec"].get("initContainers", [])]
    fetchers = [c for c in inits if c["name"] == "fetch-model"]
    assert fetchers and all("model prepare --download" in c["command"][2] for c in fetchers)
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "2",
           "HF_HUB_DOWNLOAD_TIMEOUT": "2", "HF_HUB_DISABLE_TELEMETRY": "1"}
    r = fleetserve("model", "prepare", "hf:org/tiny", "--download", env=env, timeout=120)
    assert r.returncode == 2 and "hf:org/tiny: cannot download" in r.stderr and "Traceback" not in r.stderr


def test_the_operator_without_a_cluster_says_why_in_one_line(tmp_path):
    """No kubeconfig and no service account, or an API server that refuses: two chained tracebacks, exit 1."""
    from tests.helpers import fleetserve

    # not in a pod either, even where the tests run in one (an empty service host is no in-cluster config)
    env = {"KUBECONFIG": str(tmp_path / "none.yaml"), "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": ""}
    r = fleetserve("operator", env=env, timeout=120)
    assert r.returncode == 2 and "no Kubernetes credentials" in r.stderr and "Traceback" not in r.stderr, r.stderr
    config = tmp_path / "refusing.yaml"
    config.write_text("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
                      "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
                      "users: [{name: u, user: {token: x}}]\n")
    r = fleetserve("operator", env={**env, "KUBECONFIG": str(config)}, timeout=120)
    assert r.returncode == 1 and "cannot reach the Kubernetes API server" in r.stderr and "Traceback" not in r.stderr
    r = fleetserve("operator", "--webhook-cert-dir", str(tmp_path), env=env, timeout=120)
    assert r.returncode == 2 and "--webhook-cert-dir" in r.stderr and "tls.crt or tls.key" in r.stderr


def test_an_endpoint_of_the_same_name_in_another_namespace_is_never_overwritten(tmp_path):
    """The second render replaced all ten files of the first in place, without a word."""
    import yaml

    spec = yaml.safe_load((ROOT / "examples" / "autoscaling.yaml").read_text())
    spec["metadata"]["namespace"] = "team-b"
    other = tmp_path / "b.yaml"
    other.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    assert _run("render", "k8s", str(ROOT / "examples" / "autoscaling.yaml"), "-o", str(out)).exit_code == 0
    before = {p.name: p.read_text() for p in out.iterdir()}
    again = _run("render", "k8s", str(ROOT / "examples" / "autoscaling.yaml"), "-o", str(out))
    assert again.exit_code == 0, again.output  # the same endpoint again: its own files
    clash = _run("render", "k8s", str(other), "-o", str(out))
    assert clash.exit_code == 2 and "--output" in clash.stderr and "in namespace" in clash.stderr, clash.output
    assert {p.name: p.read_text() for p in out.iterdir()} == before


@pytest.mark.parametrize("flag, value", [
    ("--prometheus-url", "notaurl"), ("--image", ""), ("--image", "a b"), ("--node-class", "Bad Name!"),
    ("--service-account", "Bad_SA"), ("--zone", "not a zone!"), ("--model-pvc", "-x"),
])
def test_flag_values_kubernetes_would_refuse_are_exit_2_naming_the_flag(flag, value):
    """Each exited 0 and wrote manifests that `kubectl apply` refused."""
    import typer

    from fleetserve.cli.render_commands import _options

    with pytest.raises(typer.Exit) as info:
        _options(**{"image": None, "prometheus_url": None, "node_class": None, "zone": None, "router_replicas": None,
                    "service_account": None, "model_pvc": None,
                    flag[2:].replace("-", "_"): [value] if flag == "--zone" else value})
    assert info.value.exit_code == 2


def test_bad_flags_and_an_install_namespace_exit_2_from_the_command_line(tmp_path):
    r = _run("render", "k8s", str(ROOT / "examples" / "hyperpod.yaml"), "-o", str(tmp_path / "a"), "--node-class",
             "Bad Name!")
    assert r.exit_code == 2 and "--node-class 'Bad Name!'" in r.stderr and not (tmp_path / "a").exists()
    r = _run("render", "k8s", "--install", "-o", str(tmp_path / "b"), "--namespace", "BAD NS")
    assert r.exit_code == 2 and "--namespace 'BAD NS'" in r.stderr


def test_install_only_flags_without_install_and_a_bad_spec_under_json_say_so(tmp_path):
    """`--namespace foo` rendered the spec's namespace without a word; `--json` on a bad spec printed nothing on
    stdout; a missing spec file without -o was reported as the missing -o."""
    spec = str(ROOT / "examples" / "autoscaling.yaml")
    for flags in (["--namespace", "foo"], ["--webhook-ca-bundle", str(tmp_path / "ca.pem")]):
        r = _run("render", "k8s", spec, "--json", *flags)
        assert r.exit_code == 2 and flags[0] in r.stderr and "metadata.namespace" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: x}\n"
                   "spec: {model: {source: builtin:smollm2-135m}, replicas: -1}\n")
    r = _run("render", "k8s", str(bad), "--json")
    assert r.exit_code == 2
    body = json.loads(r.stdout)
    assert body["valid"] is False and body["errors"][0]["path"] == "spec.replicas"
    r = _run("render", "k8s", str(tmp_path / "absent.yaml"))
    assert r.exit_code == 2 and "absent.yaml" in r.stderr and "--output" not in r.stderr


def test_the_tls_secret_to_create_is_named_with_its_keys(tmp_path):
    text = (ROOT / "examples" / "quickstart.yaml").read_text() + "  tls: {enabled: true}\n"
    spec = tmp_path / "tls.yaml"
    spec.write_text(text)
    r = _run("render", "k8s", str(spec), "--json")
    assert r.exit_code == 0, r.output
    needed = {s["name"]: s["keys"] for s in json.loads(r.stdout)["secrets_needed"]}
    (tls,) = [keys for name, keys in needed.items() if name.endswith("-tls")]
    assert tls == ["tls.crt", "tls.key"]  # it was []: the mount took the whole Secret


def test_monitoring_labels_reach_what_the_prometheus_operator_selects(tmp_path):
    """kube-prometheus-stack selects ServiceMonitors and rules by `release: <its release>`: without a way to say
    so, it loaded neither (the router unscraped, every trigger failing, and the alert that says so unloaded)."""
    spec = str(ROOT / "examples" / "autoscaling.yaml")
    r = _run("render", "k8s", spec, "--json", "--monitoring-label", "release=kps", "--monitoring-label", "team=ml")
    assert r.exit_code == 0, r.output
    objects = json.loads(r.stdout)["objects"]
    monitoring = [o for o in objects if o["kind"] in ("ServiceMonitor", "PrometheusRule")]
    assert monitoring
    for obj in monitoring:
        labels = obj["metadata"]["labels"]
        assert labels["release"] == "kps" and labels["team"] == "ml"
        assert labels["app.kubernetes.io/name"] == "fleetserve"
    assert all("release" not in o["metadata"].get("labels", {}) for o in objects if o not in monitoring)
    for bad in ("release", "=x", "release=a b", "app.kubernetes.io/name=x"):
        r = _run("render", "k8s", spec, "--json", "--monitoring-label", bad)
        assert r.exit_code == 2 and "--monitoring-label" in r.stderr, bad
    r = _run("render", "k8s", "--install", "--json", "--monitoring-label", "release=kps")
    (operator,) = [o for o in json.loads(r.stdout)["objects"] if o["kind"] == "Deployment"]
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--monitoring-label") + 1] == "release=kps"  # the operator renders them too


def test_a_cluster_domain_other_than_cluster_local_reaches_every_service_name():
    """svc.cluster.local was written into the router's --backend-dns, the Redis URLs and the Prometheus address:
    on a cluster with its own domain none of them resolved."""
    spec = str(ROOT / "examples" / "autoscaling.yaml")
    r = _run("render", "k8s", spec, "--json", "--cluster-domain", "corp.internal")
    assert r.exit_code == 0, r.output
    text = json.dumps(json.loads(r.stdout)["objects"])
    assert "cluster.local" not in text
    assert ".svc.corp.internal:" in text and "prometheus-operated.monitoring.svc.corp.internal:9090" in text
    r = _run("render", "k8s", spec, "--json", "--cluster-domain", "Bad Domain")
    assert r.exit_code == 2 and "--cluster-domain" in r.stderr
    r = _run("render", "k8s", "--install", "--json", "--cluster-domain", "corp.internal")
    (operator,) = [o for o in json.loads(r.stdout)["objects"] if o["kind"] == "Deployment"]
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--cluster-domain") + 1] == "corp.internal"
    assert "http://prometheus-operated.monitoring.svc.corp.internal:9090" in args


def test_the_model_claim_an_fsx_source_reads_is_named_with_what_to_create(tmp_path):
    """HyperPod's FSx example renders engines that mount the claim NAME-model, which nothing renders: the closing
    note named the Secrets only, and the claim was said only inside a long warning."""
    doc = yaml.safe_load((ROOT / "examples" / "hyperpod.yaml").read_text())
    doc["spec"]["modelSourceConfig"] = {"modelSourceType": "fsx", "modelLocation": "deepseek-1-5b",
                                        "fsxStorage": {"fileSystemId": "fs-1234abcd"}}
    spec = tmp_path / "fsx.yaml"
    spec.write_text(yaml.safe_dump(doc))
    r = _run("render", "k8s", str(spec), "--json")
    assert r.exit_code == 0, r.output
    (claim,) = json.loads(r.stdout)["claims_needed"]
    assert claim.endswith("-model")
    r = _run("render", "k8s", str(spec), "-o", str(tmp_path / "out"))
    note = " ".join(r.stderr.split())
    assert f"the PersistentVolumeClaim(s) {claim} (docs/kubernetes.md" in note, note
    assert "the Secret(s) " in note  # both on the one line
    r = _run("render", "k8s", str(ROOT / "examples" / "hyperpod.yaml"), "--json")  # S3: fetched, no claim
    assert json.loads(r.stdout)["claims_needed"] == []
