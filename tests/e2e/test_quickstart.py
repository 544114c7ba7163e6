"""The README's promise with the real demo model: quickstart up, openai client, down, nothing left."""

import json
import os
from pathlib import Path

import openai
import pytest

from tests.helpers import fleetserve, processes_with_env

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"

pytestmark = [pytest.mark.e2e, pytest.mark.demo]


def test_quickstart_fleet_answers_with_smollm2():
    home = {"FLEETSERVE_HOME": os.environ["FLEETSERVE_HOME"]}
    up = fleetserve("up", str(QUICKSTART), "--detach", env=home, timeout=900)
    assert up.returncode == 0, up.stderr
    try:
        (state,) = [s for s in json.loads(fleetserve("status", "--json", env=home).stdout) if s["name"] == "quickstart"]
        assert state["url"] in up.stdout and "model: smollm2" in up.stdout
        client = openai.OpenAI(base_url=state["url"], api_key="unused", max_retries=0)

        reply = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=20, temperature=0)
        answer = reply.choices[0].message.content
        assert answer.strip() and "Paris" in answer

        chunks = list(client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Name three colors."}], max_tokens=24,
            stream=True, stream_options={"include_usage": True}))
        text = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert len(text) >= 3
        usage = chunks[-1].usage
        assert usage is not None and chunks[-1].choices == []
        assert usage.completion_tokens >= len(text) and usage.prompt_tokens > 0
    finally:
        down = fleetserve("down", "quickstart", env=home)
    assert down.returncode == 0, down.stderr
    pids = [state["supervisor_pid"], state["router_pid"], *(r["pid"] for r in state["replicas"])]
    alive = [p for p in pids if p in processes_with_env("FLEETSERVE_HOME", home["FLEETSERVE_HOME"])]
    assert alive == []
