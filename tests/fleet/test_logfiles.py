"""Log files rotated by copy and truncate while a real process appends to them."""

import subprocess
import sys

from fleetserve.fleet.logfiles import KEEP, rotate_over, rotated_name
from tests.helpers import wait_until

WRITER = "import sys, time\nfor i in range(10**6):\n    print(f'line {i:07d}', flush=True)\n    time.sleep(0.002)\n"


def test_a_file_past_its_limit_is_rotated_under_a_writer_that_appends(tmp_path):
    path = tmp_path / "r0.log"
    with open(path, "ab") as out:  # as the supervisor opens every child's log
        writer = subprocess.Popen([sys.executable, "-c", WRITER], stdout=out, stderr=subprocess.STDOUT)
    try:
        for generation in range(1, KEEP + 2):
            wait_until(lambda: path.stat().st_size > 2000, 30, what="the writer's lines")
            assert rotate_over([path, tmp_path / "absent.log"], 2000) == [path]
            assert rotated_name(path, min(generation, KEEP)).exists()
            assert rotate_over([path], 0) == []  # 0: never
        assert not rotated_name(path, KEEP + 1).exists()  # KEEP generations, the oldest dropped
        wait_until(lambda: path.stat().st_size >= 64, 30, what="the writer's next lines")
        head = path.read_bytes()[:64]
    finally:
        writer.kill()
        writer.wait()
    # the writer's next line landed at the start of the emptied file: no hole of NUL bytes up to its old offset
    assert head.startswith(b"line ") and b"\0" not in head
    assert all(rotated_name(path, g).read_bytes().startswith(b"line ") for g in range(1, KEEP + 1))
