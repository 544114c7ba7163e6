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


def test_standard_output_is_written_to_piped_or_redirected_never_replaced(tmp_path):
    """`-o /dev/stdout` resolved through its link to /proc/PID/fd/pipe:[N] and failed ("No such file"); redirected
    to a file, the shell's file was renamed over and the rest of the output went to the old one."""
    import subprocess
    import sys

    code = ("import sys; from fleetserve.whole_file import write_whole_text; print('before', flush=True); "
            "write_whole_text('/dev/stdout', 'written\\n'); print('after', flush=True)")
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert piped.stdout == "before\nwritten\nafter\n"
    out = tmp_path / "out.txt"
    out.write_text("earlier\n")
    with open(out, "a") as f:
        subprocess.run([sys.executable, "-c", code], stdout=f, check=True)
    assert out.read_text() == "earlier\nbefore\nwritten\nafter\n"


def test_the_temporary_file_is_private_and_a_new_file_gets_the_umask(tmp_path):
    seen = []
    target = tmp_path / "secret.yaml"
    target.write_text("old")
    target.chmod(0o600)

    def look(f):
        (tmp,) = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        seen.append(stat.S_IMODE(tmp.stat().st_mode))
        f.write("new")

    write_whole(target, look)
    assert seen == [0o600] and target.read_text() == "new"
    fresh = tmp_path / "fresh.yaml"
    write_whole_text(fresh, "x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask
