import os
import signal

import pytest

from tests.helpers import processes_with_env


@pytest.fixture()
def home(tmp_path):
    """A FLEETSERVE_HOME of this test's own: leftovers are found by it in /proc/*/environ and killed."""
    path = tmp_path / "home"
    path.mkdir()
    yield {"FLEETSERVE_HOME": str(path)}
    for pid in processes_with_env("FLEETSERVE_HOME", str(path)):  # never leak into other tests
        os.kill(pid, signal.SIGKILL)
