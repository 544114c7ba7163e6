"""scripts/k8s-e2e.sh needs Docker and a cluster (none here): it is only checked for syntax."""

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "k8s-e2e.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
def test_e2e_script_parses():
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    text = SCRIPT.read_text()
    assert "NOT RUN IN CI" in text and "render k8s --install" in text and "DeploymentComplete" in text
