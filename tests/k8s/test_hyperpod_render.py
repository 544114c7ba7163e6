"""HyperPod's pod-level fields (the audit list of issue 11) rendered into the Kubernetes objects, all valid."""

from __future__ import annotations

from fleetserve.k8s.render import render
from fleetserve.spec.load import load_spec_text
from tests.k8s.validate import validate
from tests.spec.test_hyperpod import AUDIT, HF_TOKEN


def _render(text):
    rendered = render(load_spec_text(text).endpoint)
    for obj in rendered.objects:
        assert validate(obj) == [], (obj["kind"], obj["metadata"]["name"], validate(obj))
    return rendered


def _one(rendered, kind, component=None):
    objs = [o for o in rendered.objects if o["kind"] == kind
            and (component is None or o["metadata"]["labels"].get("app.kubernetes.io/component") == component)]
    assert len(objs) == 1, [o["metadata"]["name"] for o in objs]
    return objs[0]


def test_audit_fields_are_rendered():
    r = _render(AUDIT)
    dep = _one(r, "Deployment", "engine")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]          # worker.command
    assert c["workingDir"] == "/workspace"                                                  # worker.workingDir
    assert c["readinessProbe"]["periodSeconds"] == 7                                        # worker.probes
    assert c["livenessProbe"]["failureThreshold"] == 9
    assert "startupProbe" in c                                                              # ours kept
    assert c["resources"]["limits"] == {"memory": "30Gi", "nvidia.com/gpu": "1"}            # worker.resources
    assert c["resources"]["requests"] == {"cpu": "6", "nvidia.com/gpu": "1"}
    env = {e["name"]: e for e in c["env"]}
    assert env["LOG_LEVEL"]["value"] == "info"                                              # environmentVariables
    assert env["API_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "api", "key": "token"}}  # ... valueFrom
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["model"] == "/opt/ml/model"                                               # modelVolumeMount
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "llama-weights"}      # kubernetesVolume
    assert volumes["scratch"] == {"name": "scratch", "emptyDir": {}}                         # kubernetes.volumes
    assert pod["schedulerName"] == "gpu-scheduler"                                          # kubernetes.*
    assert pod["serviceAccountName"] == "model-reader"
    assert [i["name"] for i in pod["initContainers"]] == ["warm"]
    assert dep["metadata"]["annotations"]["owner"] == "platform"                            # metadata.annotations
    assert dep["spec"]["template"]["metadata"]["annotations"]["owner"] == "platform"
    assert dep["metadata"]["labels"]["team"] == "a"                                         # metadata.labels
    assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in c["ports"]      # modelMetrics.port
    sm = [o for o in r.objects if o["kind"] == "ServiceMonitor" and o["metadata"]["name"].endswith("-engine")][0]
    ep = sm["spec"]["endpoints"][0]
    assert (ep["port"], ep["path"], ep["interval"]) == ("metrics", "/stats", "30s")      # modelMetrics, interval
    svc = [o for o in r.objects if o["kind"] == "Service" and o["metadata"]["name"].endswith("-engine")][0]
    assert any(p["name"] == "metrics" and p["port"] == 9100 for p in svc["spec"]["ports"])
    trig = _one(r, "ScaledObject")["spec"]["triggers"][0]
    assert trig["metricType"] == "Value"                                                    # trigger metricType
    assert trig["useCachedMetrics"] is True                                                 # useCachedMetrics
    assert trig["metadata"]["customHeaders"] == "X-Scope-OrgID=team-a"                      # customHeaders
    assert trig["metadata"]["namespace"] == "team-a"                                        # namespace


def test_hf_token_secret_reaches_the_fetcher_only():
    r = _render(HF_TOKEN)
    pod = _one(r, "Deployment", "engine")["spec"]["template"]["spec"]
    fetch = pod["initContainers"][0]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}} in fetch["env"]
    assert all(e["name"] != "HF_TOKEN" for e in pod["containers"][0]["env"])
    # modelVolumeMount.mountPath (default /opt/ml/model): the fetcher and the engine share it
    assert fetch["volumeMounts"] == [{"name": "model", "mountPath": "/opt/ml/model"}]
    assert "/opt/ml/model/current" in " ".join(pod["containers"][0]["args"])


def test_builtin_engine_env_port_and_labels_render():
    text = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {name: b, labels: {cost-center: "42"}}
spec:
  model: {source: "builtin:smollm2-135m"}
  engine: {port: 9000, env: {OMP_NUM_THREADS: "2"}}
  metrics: {scrapeIntervalSeconds: 20}
"""
    r = _render(text)
    dep = _one(r, "Deployment", "engine")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["ports"][0]["containerPort"] == 9000 and "9000" in c["args"]                  # engine.port
    assert {"name": "OMP_NUM_THREADS", "value": "2"} in c["env"]                           # engine.env
    assert all(o["metadata"]["labels"]["cost-center"] == "42" for o in r.objects)          # metadata.labels
    sm = [o for o in r.objects if o["kind"] == "ServiceMonitor"][0]
    assert sm["spec"]["endpoints"][0]["interval"] == "20s"                                 # scrapeIntervalSeconds


def test_render_cli_does_not_repeat_local_only_warnings(tmp_path):
    from typer.testing import CliRunner

    from fleetserve.cli.app import app

    spec = tmp_path / "audit.yaml"
    spec.write_text(AUDIT)
    result = CliRunner().invoke(app, ["render", "k8s", str(spec), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "applies to Kubernetes rendering only" not in result.stderr
    for line in result.stderr.splitlines():
        assert line.startswith(("warning: ", "note: create before applying")), line


def test_wrong_type_exits_2_naming_the_path(tmp_path):
    from typer.testing import CliRunner

    from fleetserve.cli.app import app

    spec = tmp_path / "bad.yaml"
    spec.write_text(AUDIT.replace("workingDir: /workspace", "workingDir: [1]"))
    result = CliRunner().invoke(app, ["render", "k8s", str(spec), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "spec.worker.workingDir: expected a string (got [1])" in result.stderr


FSX_LMI = """
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: InferenceEndpointConfig
metadata: {name: deepseek15b, namespace: default}
spec:
  modelName: deepseek15b
  instanceType: ml.g5.8xlarge
  modelSourceConfig:
    modelSourceType: fsx
    fsxStorage: {fileSystemId: fs-0123456789abcdef0}
    modelLocation: deepseek-1-5b
  worker:
    image: 763104351884.dkr.ecr.us-east-2.amazonaws.com/djl-inference:0.32.0-lmi14.0.0-cu124
    resources: {limits: {nvidia.com/gpu: 1}, requests: {nvidia.com/gpu: 1, cpu: 25600m, memory: 102Gi}}
    modelInvocationPort: {containerPort: 8080, name: http}
    modelVolumeMount: {name: model-weights, mountPath: /opt/ml/model}
"""


def test_an_fsx_model_is_mounted_where_an_image_run_as_given_reads_it():
    """AWS's FSx + DJL-LMI example: the file system had been mounted at /fsx, and the image found an empty
    /opt/ml/model (a crash loop). The model's folder of the volume is mounted at modelVolumeMount.mountPath."""
    pod = _one(_render(FSX_LMI), "Deployment", "engine")["spec"]["template"]["spec"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model"]
    assert mount == {"name": "model", "mountPath": "/opt/ml/model", "subPath": "deepseek-1-5b", "readOnly": True}
    (volume,) = [v for v in pod["volumes"] if v["name"] == "model"]
    assert "persistentVolumeClaim" in volume


def test_a_model_path_that_only_begins_like_opt_ml_model_is_not_taken_for_it():
    """`/opt/ml/models/llama` made render fail with pathlib's "is not in the subpath of '/opt/ml/model'" (an image
    run as given), and was mounted at /opt/ml/model, outside its own path (a GPU engine)."""
    import pytest

    from fleetserve.spec.load import load_spec_data

    def spec(kind, **model):
        return {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "a"},
                "spec": {"model": {"name": "m", "source": "/opt/ml/models/llama", **model},
                         "engine": {"kind": kind, "gpus": 1,
                                    **({"image": "example.com/lmi:1"} if kind == "container" else {})}}}

    pod = _one(render(load_spec_data(spec("container", mountPath="/opt/ml/model")).endpoint), "Deployment",
               "engine")["spec"]["template"]["spec"]
    (m,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model"]
    assert m["mountPath"] == "/opt/ml/model" and m["subPath"] == "ml/models/llama", m  # the volume is /opt's
    with pytest.raises(ValueError, match="would mount the model volume at /opt, over the image's own folder"):
        render(load_spec_data(spec("vllm")).endpoint)
