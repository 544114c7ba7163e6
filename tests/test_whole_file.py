"""Output files are written whole or not at all (`whole_file`)."""

import os
import stat

import pytest

from fleetserve.whole_file import write_whole, write_whole_text


def test_a_write_cut_short_leaves_the_old_file_and_no_temporary_one(tmp_path):
    target = tmp_path / "planned.yaml"
    target.write_text("the last good plan\n")

    def cut_short(f):
        f.write("half a pl")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_whole(target, cut_short)
    assert target.read_text() == "the last good plan\n" and os.listdir(tmp_path) == ["planned.yaml"]
    target.chmod(0o600)
    write_whole_text(target, "the new plan\n")
    assert target.read_text() == "the new plan\n" and os.listdir(tmp_path) == ["planned.yaml"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600  # replaced, not made readable to all


def test_a_link_stays_a_link_and_a_device_stays_a_device(tmp_path):
    real = tmp_path / "real.yaml"
    real.write_text("old")
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    write_whole_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    write_whole_text("/dev/null", "gone")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    with pytest.raises(OSError):
        write_whole_text("/dev/full", "x" * 100_000)
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    write_whole_text(tmp_path / "new" / "folder" / "r.html", "<html/>")  # missing folders are made
    assert (tmp_path / "new" / "folder" / "r.html").read_text() == "<html/>"
