"""`fleetserve render k8s`: files, JSON, warnings on stderr only, exit 2 naming the field."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from fleetserve.cli.app import app

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return CliRunner().invoke(app, list(args))


def test_hyperpod_example_writes_the_core_objects(tmp_path):
    result = _run("render", "k8s", str(ROOT / "examples" / "hyperpod.yaml"), "-o", str(tmp_path))
    assert result.exit_code == 0, result.output
    kinds = {p.name.split("-")[1] for p in tmp_path.iterdir()}
    assert {"deployment", "service", "scaledobject", "nodepool"} <= kinds
    for line in result.stderr.splitlines():
        assert line.startswith("warning: "), line


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
