"""s3:// model sources against a real S3-compatible server (moto in server mode)."""

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from fleetserve.engine.demo import ModelSourceError
from fleetserve.engine.sources import resolve_source
from fleetserve.fleet.process import free_port
from tests.helpers import http_ok, wait_until


@pytest.fixture()
def s3(monkeypatch, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_ok(url + "/moto-api/"), 60, what="moto server")
    for key, value in {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path / "home"))
    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
    client.create_bucket(Bucket="models")
    yield client
    proc.terminate()
    proc.wait(timeout=30)


def upload(client, folder, prefix):
    for path in folder.iterdir():
        if path.is_file():
            client.upload_file(str(path), "models", f"{prefix}/{path.name}")


def test_s3_model_is_fetched_once_and_loads(s3, tiny_model):
    upload(s3, tiny_model, "team/tiny")
    local = resolve_source("s3://models/team/tiny")
    assert (local / "config.json").is_file() and (local / "model.safetensors").is_file()
    marker = local / "config.json"
    mtime = marker.stat().st_mtime_ns
    assert resolve_source("s3://models/team/tiny") == local and marker.stat().st_mtime_ns == mtime  # cached
    from fleetserve.engine.runner import ModelRunner

    assert ModelRunner(local).vocab_size() > 0


def test_a_damaged_local_copy_is_fetched_again(s3, tiny_model):
    """A copy whose manifest still matched was kept however damaged; its check said to prepare it again, which
    kept it again."""
    upload(s3, tiny_model, "team/tiny")
    local = resolve_source("s3://models/team/tiny")
    weights = local / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[:len(whole) // 2])
    assert resolve_source("s3://models/team/tiny") == local and weights.read_bytes() == whole


def test_missing_and_incomplete_s3_models_are_clear_errors(s3, tiny_model):
    with pytest.raises(ModelSourceError, match="no objects under this prefix"):
        resolve_source("s3://models/nothing-here")
    s3.upload_file(str(tiny_model / "config.json"), "models", "half/config.json")
    with pytest.raises(ModelSourceError, match="incomplete: missing weights"):
        resolve_source("s3://models/half")
    copy = next((Path(os.environ["FLEETSERVE_HOME"]) / "models" / "s3").glob("*/config.json"))
    fetched = copy.stat().st_mtime_ns
    with pytest.raises(ModelSourceError, match="incomplete: missing weights"):
        resolve_source("s3://models/half")
    assert copy.stat().st_mtime_ns == fetched  # what the objects lack is no reason to download them all again
    assert os.environ["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")


def test_hf_source_comes_from_the_local_cache_only(tmp_path, monkeypatch, tiny_model):
    import shutil

    hub = tmp_path / "hub"
    snapshot = hub / "models--acme--tiny" / "snapshots" / ("a" * 40)
    shutil.copytree(tiny_model, snapshot)
    (hub / "models--acme--tiny" / "refs").mkdir(parents=True)
    (hub / "models--acme--tiny" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_source("hf:acme/tiny") == snapshot
    with pytest.raises(ModelSourceError, match="not in the local Hugging Face cache"):
        resolve_source("hf:acme/missing")


def test_an_s3_endpoint_that_does_not_answer_is_a_source_error_wherever_it_is_resolved(monkeypatch, tmp_path):
    """`profile --model s3://...` and `up` printed botocore's traceback; only `model prepare` caught it."""
    for key, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_ACCESS_KEY_ID": "test",
                       "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path / "home"))
    with pytest.raises(ModelSourceError, match=r"s3://models/x: Could not connect"):
        resolve_source("s3://models/x")


def test_a_hub_download_leaves_out_the_original_folder(monkeypatch, tmp_path):
    """Meta's repos keep a second copy of the weights in `original/` (their own format, read by no engine here):
    an 8B model took 32 GB of the node's disk where its init container had asked for 17 GiB."""
    import huggingface_hub

    from fleetserve.engine.sources import _hf_cache_dir

    asked = {}

    def snapshot_download(repo_id, **kwargs):
        asked.update(kwargs, repo_id=repo_id)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert _hf_cache_dir("meta-llama/Llama-3.1-8B-Instruct", None, download=True) == tmp_path
    assert asked["ignore_patterns"] == ["original/*"] and asked["local_files_only"] is False
