"""The CLI's stdout console when it is not a terminal."""

from rich.table import Table

from fleetserve.cli.console import _stdout


def wide_table() -> Table:
    table = Table("fleet", "error")
    table.add_row("demo", "replica 0 exited with code 1: " + "x" * 150)
    return table


def test_a_table_into_a_pipe_keeps_each_row_on_one_line(capsys, monkeypatch):
    """rich assumed 80 columns off a terminal and folded wide cells: `status | grep NAME` found half a row."""
    monkeypatch.delenv("COLUMNS", raising=False)
    _stdout().print(wide_table())
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5  # top, header, rule, the row, bottom
    assert "x" * 150 in lines[3]


def test_columns_still_sets_the_width(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    _stdout().print(wide_table())
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 60


def test_a_failures_json_path_is_the_flag_or_field_its_message_starts_with():
    from fleetserve.cli.console import _named_path

    assert _named_path("--profile: unknown profile 'x'") == "--profile"
    assert _named_path("--namespace applies to --install") == "--namespace"  # had been ""
    assert _named_path("spec.slo.ttftP95Ms: must be > 0") == "spec.slo.ttftP95Ms"
    assert _named_path("no fleet named 'x'") == "" and _named_path("spec is bad") == ""
