"""Inputs that are no input: a device, a file far too large, a line with no end, a YAML alias bomb, a reader that
stops reading. Each is exit 2 with the parameter named (or a quiet stop), never a MemoryError or a hang (found in a
black-box pass of the offline tools)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetserve.spec.errors import SpecError
from fleetserve.spec.load import load_spec
from fleetserve.traces import load
from fleetserve.traces.load import TraceError, load_trace
from tests.helpers import fleetserve

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "examples" / "quickstart.yaml")


@pytest.mark.parametrize("args", [["analyze", "/dev/zero"],
                                  ["trace", "scale", "/dev/zero", "--rate", "2", "-o", "{tmp}/x.jsonl"],
                                  ["simulate", QUICKSTART, "--trace", "/dev/zero"]],
                         ids=["analyze", "trace-scale", "simulate"])
def test_a_device_is_named_as_no_regular_file(args, tmp_path):
    result = fleetserve(*[a.replace("{tmp}", str(tmp_path)) for a in args], timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "not a regular file" in " ".join(result.stderr.split()) and "Traceback" not in result.stderr


def test_a_spec_is_read_from_a_pipe_but_never_past_the_size_of_any_spec(tmp_path):
    """`validate <(envsubst < spec.yaml)` reads a pipe, and must go on working; /dev/zero (and a model file given
    by mistake) had been read whole, to a MemoryError."""
    piped = subprocess.run(["bash", "-c", f"{sys.executable} -m fleetserve validate <(cat {QUICKSTART})"],
                           capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0, piped.stderr
    zero = fleetserve("validate", "/dev/zero", timeout=120)
    assert zero.returncode == 2 and "holds more than 16777216 bytes" in zero.stderr, zero.stderr


def test_a_spec_file_larger_than_any_spec_is_refused_unread(tmp_path, monkeypatch):
    from fleetserve.spec import load as spec_load

    big = tmp_path / "model.safetensors"
    big.write_bytes(b"\0" * 4096)
    monkeypatch.setattr(spec_load, "MAX_SPEC_BYTES", 1024)
    with pytest.raises(SpecError, match="holds more than 1024 bytes"):
        load_spec(big)


@pytest.mark.parametrize("where", ["fleetserve", "hyperpod"])
def test_a_yaml_alias_bomb_is_refused_as_it_is_read(tmp_path, where):
    """Nine lists of nine, six deep: parsed in a millisecond by reference, then walked whole by the field checks,
    HyperPod's translation and the error's echo of the value (minutes, and with more levels, memory)."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 6)]
    if where == "fleetserve":
        lines += ['apiVersion: fleetserve.io/v1', 'kind: Endpoint', 'metadata: {name: bomb}', 'spec:',
                  '  model: {source: "builtin:smollm2-135m"}', '  engine:', '    env: *a5']
    else:
        text = (ROOT / "examples" / "hyperpod.yaml").read_text()
        lines += [text.replace("modelName:", "modelName: *a5\n  unusedName:", 1)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(SpecError, match="expands to more than 100,000 values through its aliases"):
        load_spec(bomb)


def test_a_value_in_an_error_reads_as_python_writes_it_unless_it_is_large():
    from fleetserve.spec.errors import short_value

    assert short_value({"zeta": 1, "alpha": 2}) == "{'zeta': 1, 'alpha': 2}"
    assert short_value(list(range(20))) == repr(list(range(20)))
    assert short_value([[[["deep"]]]]) == "[[[['deep']]]]"
    assert short_value("x" * 100) == "'" + "x" * 76 + "..."
    shared = ["x"] * 9
    for _ in range(8):
        shared = [shared] * 9  # 387 M values by reference: abridged as written, in 80 characters
    assert len(short_value(shared)) <= 80


def test_a_trace_line_without_an_end_is_an_error_with_its_line(tmp_path, monkeypatch):
    monkeypatch.setattr(load, "MAX_LINE_CHARS", 1000)
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}) + "\n"
                     + "x" * 5000 + "\n")
    with pytest.raises(TraceError, match=r"t.jsonl:2: a line of more than 1000 characters"):
        load_trace(trace)


def test_a_prompt_longer_than_any_request_is_refused_with_its_line(tmp_path, monkeypatch):
    """17 M words: `analyze` tokenized it to a native abort at 6 GB, `trace scale --format mooncake` wrote an
    input_length its own loader refuses."""
    monkeypatch.setattr(load, "MAX_TOKENS", 100)
    log = tmp_path / "p.jsonl"
    log.write_text(json.dumps({"timestamp": 0, "prompt": "hello there", "max_tokens": 5}) + "\n"
                   + json.dumps({"timestamp": 1, "prompt": "a " * 150, "max_tokens": 5}) + "\n")
    with pytest.raises(TraceError, match=r"p.jsonl:2: the prompt is 150 words long; at most 100 tokens"):
        load_trace(log)


@pytest.mark.parametrize("command", ["scale", "generate"])
def test_a_reader_that_stops_stops_the_writer_quietly(command):
    """`trace scale ... -o - | head -1` printed "error: --output: cannot write -: Broken pipe" and exited 2."""
    args = ([str(ROOT / "tests" / "data" / "mooncake_synthetic_trace.jsonl"), "--rate", "4"] if command == "scale"
            else ["chat", "--duration", "3600", "--rate", "20", "--format", "mooncake"])
    proc = subprocess.Popen([sys.executable, "-m", "fleetserve", "trace", command, *args, "-o", "-"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"{")
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141 and "error" not in stderr and "Traceback" not in stderr, stderr
