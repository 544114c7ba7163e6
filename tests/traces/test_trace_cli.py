import json
from pathlib import Path

import pytest

from fleetserve.traces.load import detect_format, load_trace
from tests.helpers import fleetserve


def said(result) -> str:
    """stderr with rich's box borders and line wrapping undone."""
    return " ".join(result.stderr.replace("│", " ").split())

DATA = Path(__file__).parents[1] / "data"


def test_generate_writes_each_format_deterministically(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path in (a, b):
        result = fleetserve("trace", "generate", "rag", "-o", str(path), "--duration", "60", "--seed", "4",
                            "--documents", "10")
        assert result.returncode == 0, result.stderr
    assert a.read_text() == b.read_text()
    reqs = load_trace(a)
    assert reqs and all(r.hash_ids for r in reqs)
    log = tmp_path / "log.jsonl"
    assert fleetserve("trace", "generate", "system-prompt", "-o", str(log), "--format", "prompts",
                      "--duration", "30", "--arrivals", "bursts").returncode == 0
    assert load_trace(log)[0].messages[0]["role"] == "system"


def test_scale_rate_and_time(tmp_path):
    out = tmp_path / "azure100.csv"
    result = fleetserve("trace", "scale", str(DATA / "azure_code_sample.csv"), "--rate", "100", "-o", str(out))
    assert result.returncode == 0, result.stderr
    base, big = load_trace(DATA / "azure_code_sample.csv"), load_trace(out)
    assert len(big) == 100 * len(base) and big[-1].arrival_s <= base[-1].arrival_s * 1.1
    slow = tmp_path / "slow.jsonl"
    assert fleetserve("trace", "scale", str(DATA / "mooncake_sample.jsonl"), "--time", "2", "-o",
                      str(slow)).returncode == 0
    assert load_trace(slow)[-1].arrival_s == 2 * load_trace(DATA / "mooncake_sample.jsonl")[-1].arrival_s


def test_bad_input_names_the_parameter(tmp_path):
    result = fleetserve("trace", "generate", "weekly", "-o", str(tmp_path / "x"))
    assert result.returncode == 2 and "diurnal, bursts, chat, system-prompt, rag" in said(result)
    result = fleetserve("trace", "generate", "chat", "-o", str(tmp_path / "x"), "--format", "parquet")
    assert result.returncode == 2 and "--format" in said(result) and "mooncake, prompts, azure" in said(result)
    result = fleetserve("trace", "scale", str(DATA / "azure_code_sample.csv"), "-o", str(tmp_path / "x"))
    assert result.returncode == 2 and "--rate" in said(result)
    result = fleetserve("trace", "scale", str(DATA / "azure_code_sample.csv"), "--rate", "2", "--format",
                        "prompts", "-o", str(tmp_path / "x"))
    assert result.returncode == 2 and "prompt text" in said(result)


def test_a_trace_is_read_by_its_content_whatever_its_name(tmp_path):
    """`trace generate --format azure -o x.jsonl` wrote a file the loader then refused ("not JSON")."""
    for fmt, name in (("azure", "as.jsonl"), ("mooncake", "as.csv")):
        out = tmp_path / name
        assert fleetserve("trace", "generate", "chat", "--format", fmt, "-o", str(out), "--duration", "20",
                          "--seed", "3").returncode == 0
        assert detect_format(out) == fmt and len(load_trace(out)) > 0


def test_generate_refuses_a_workload_over_the_trace_token_limit(tmp_path):
    result = fleetserve("trace", "generate", "chat", "-o", str(tmp_path / "huge.jsonl"), "--duration", "30",
                        "--input-tokens", "10000000", "--turns", "3", "--think", "1")
    assert result.returncode == 2 and "16777216" in result.stderr and "--input-tokens" in result.stderr
    assert not (tmp_path / "huge.jsonl").exists()


def test_requests_beyond_what_fits_in_memory_are_refused_naming_the_option(tmp_path):
    """Before: `simulate --rate-scale 1e9` printed nothing for minutes, `trace generate chat --duration 1e9` died
    of a 1.8 TiB allocation; now exit 2 naming the option and the bound."""
    one = tmp_path / "one.jsonl"
    one.write_text('{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n')
    spec = str(Path(__file__).parents[2] / "examples" / "quickstart.yaml")
    for args, flag in ((("simulate", spec, "--trace", str(one), "--rate-scale", "1e9"), "--rate-scale"),
                       (("trace", "scale", str(one), "--rate", "1e8", "-o", str(tmp_path / "x.jsonl")), "--rate"),
                       (("trace", "generate", "chat", "--duration", "1e7", "--rate", "1000", "-o",
                         str(tmp_path / "y.jsonl")), "--duration/--rate")):
        result = fleetserve(*args)
        assert result.returncode == 2 and flag in said(result) and "at most 5,000,000" in said(result), said(result)
    # longer than a trace may span (a year): every reader would refuse the file, so none is written
    result = fleetserve("trace", "generate", "diurnal", "--duration", "1e9", "--rate", "0.001", "--format", "azure",
                        "-o", str(tmp_path / "far.csv"))
    assert result.returncode == 2 and "--duration" in said(result) and "366 days" in said(result)
    assert not (tmp_path / "far.csv").exists()


def test_outputs_and_times_that_cannot_work_are_exit_2(tmp_path):
    spec = str(Path(__file__).parents[2] / "examples" / "autoscaling.yaml")  # cron floors: they read the date
    trace = str(DATA / "azure_code_sample.csv")
    for args, flag in ((("trace", "generate", "chat", "-o", str(tmp_path)), "--output"),
                       (("trace", "scale", trace, "--time", "2", "-o", str(tmp_path)), "--output"),
                       (("verify", spec, "--trace", trace, "--start", "9999-12-31T23:59:59Z"), "--start"),
                       (("analyze", str(DATA / "mooncake_sample.jsonl"), "--l1-gib", "inf"), "--l1-gib"),
                       (("analyze", str(DATA / "mooncake_sample.jsonl"), "--l2-gib", "1e300"), "--l2-gib")):
        result = fleetserve(*args)
        assert result.returncode == 2 and flag in said(result) and "Traceback" not in result.stderr, said(result)


def test_an_empty_file_or_a_folder_as_trace_says_what_it_is(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    spec = str(Path(__file__).parents[2] / "examples" / "quickstart.yaml")
    result = fleetserve("simulate", spec, "--trace", str(empty))
    assert result.returncode == 2 and "holds no request" in said(result), said(result)
    result = fleetserve("simulate", spec, "--trace", str(tmp_path))
    assert result.returncode == 2 and "a trace is a file" in said(result), said(result)


def test_a_trace_spanning_more_than_a_year_is_exit_2_instead_of_a_hang(tmp_path):
    """A row at 0 and one stamped in epoch milliseconds span 56 years: simulate walked its control loop through them
    for minutes (a 1e30 s stamp: forever, with growing memory). Time scaling that would reach past a year too."""
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n'
                     '{"timestamp": 1767607200000, "input_length": 100, "output_length": 10, "hash_ids": [2]}\n')
    spec = str(Path(__file__).parents[2] / "examples" / "quickstart.yaml")
    result = fleetserve("simulate", spec, "--trace", str(mixed))
    assert result.returncode == 2 and "--trace" in said(result) and "20,458 days" in said(result), said(result)
    result = fleetserve("trace", "scale", str(DATA / "mooncake_sample.jsonl"), "--time", "1e7", "-o",
                        str(tmp_path / "out.jsonl"))
    assert result.returncode == 2 and "--time" in said(result) and "at most 366" in said(result), said(result)


def test_format_alone_converts_a_trace(tmp_path):
    """A plain conversion needed --time 1 ("give --rate and/or --time")."""
    log = tmp_path / "log.jsonl"
    made = fleetserve("trace", "generate", "chat", "--format", "prompts", "--duration", "60", "--seed", "2",
                      "-o", str(log))
    assert made.returncode == 0, made.stderr
    out = tmp_path / "log-mooncake.jsonl"
    r = fleetserve("trace", "scale", str(log), "--format", "mooncake", "-o", str(out))
    assert r.returncode == 0, r.stderr
    original, converted = load_trace(log), load_trace(out)
    assert detect_format(out) == "mooncake" and len(converted) == len(original)
    assert [r.arrival_s for r in converted] == pytest.approx([r.arrival_s for r in original], abs=1e-3)  # ms
    assert fleetserve("trace", "scale", str(log), "-o", str(out)).returncode == 2  # nothing asked: still refused


def test_generate_refuses_options_its_kind_does_not_use(tmp_path):
    """chat --documents 5, diurnal --turns 3 and rag --burst-factor 5 wrote a trace that ignored them (rag's
    arrivals stayed Poisson), and rag --docs-per-request 3 over 1 document drew 1."""
    out = str(tmp_path / "g.jsonl")
    for args, flag, says in ((("chat", "--documents", "5"), "--documents", "applies to rag workloads"),
                             (("diurnal", "--turns", "3"), "--turns", "applies to chat workloads"),
                             (("rag", "--burst-factor", "5"), "--burst-factor", "applies to bursts arrivals"),
                             (("rag", "--documents", "1", "--docs-per-request", "3"), "--docs-per-request",
                              "3 is more than the 1 documents")):
        result = fleetserve("trace", "generate", *args, "-o", out, "--duration", "30")
        assert result.returncode == 2 and flag in said(result) and says in said(result), said(result)
    ok = fleetserve("trace", "generate", "rag", "--arrivals", "bursts", "--burst-factor", "5", "-o", out,
                    "--duration", "30")
    assert ok.returncode == 0, ok.stderr


def test_output_is_never_the_input_nor_a_read_only_file(tmp_path):
    """`trace scale T -o T` replaced the trace it read (a shared read-only file included: root writes anyway)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text((DATA / "mooncake_sample.jsonl").read_text())
    before = trace.read_text()
    same = fleetserve("trace", "scale", str(trace), "--rate", "2", "-o", str(tmp_path / "." / "t.jsonl"))
    assert same.returncode == 2 and "is the command's input" in said(same) and trace.read_text() == before
    locked = tmp_path / "locked.jsonl"
    locked.write_text("keep\n")
    locked.chmod(0o444)
    ro = fleetserve("trace", "scale", str(trace), "--rate", "2", "-o", str(locked))
    assert ro.returncode == 2 and "read-only" in said(ro) and locked.read_text() == "keep\n"
    under_file = fleetserve("trace", "scale", str(trace), "--rate", "2", "-o", str(trace / "x.jsonl"))
    assert under_file.returncode == 2 and "is a file, not a folder" in said(under_file)


def test_a_servegen_model_alone_writes_its_arrivals_and_says_the_sizes_are_made_up(tmp_path):
    """simulate's ServeGen message recommends `trace scale FILE --model NAME -o out.csv`: it must work, and the
    written CSV carries sizes that no file had, which the command says (runs on the CSV cannot)."""
    agg = tmp_path / "agg.csv"
    agg.write_text("model,window_start_s,total_rate_rps,active_clients\na/x,0,1.0,3\na/x,600,3.0,3\nb/y,0,5,1\n")
    out = tmp_path / "x.csv"
    result = fleetserve("trace", "scale", str(agg), "--model", "a/x", "--duration", "600", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "carry arrivals only" in said(result) and "as if measured" in said(result)
    assert detect_format(out) == "azure" and load_trace(out)


def test_servegen_options_and_models_are_blamed_by_their_own_flags(tmp_path):
    """`--trace-model nope` was blamed on --trace, and `--duration` on a Mooncake file said "options duration_s"
    (the loader's parameter name, not the flag)."""
    agg = tmp_path / "agg.csv"
    agg.write_text("model,window_start_s,total_rate_rps,active_clients\na/x,0,1.0,3\nb/y,0,5,1\n")
    result = fleetserve("trace", "scale", str(agg), "--model", "nope", "-o", str(tmp_path / "o.csv"))
    assert result.returncode == 2 and "Invalid value for --model" in said(result) and "a/x, b/y" in said(result)
    spec = Path(__file__).parents[2] / "examples" / "hyperpod.yaml"
    result = fleetserve("simulate", str(spec), "--trace", str(agg), "--trace-model", "nope")
    assert result.returncode == 2 and "Invalid value for --trace-model" in said(result)
    result = fleetserve("simulate", str(spec), "--trace", str(agg))  # several models, none chosen
    assert result.returncode == 2 and "Invalid value for --trace-model" in said(result)
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n')
    result = fleetserve("trace", "scale", str(mooncake), "--rate", "2", "--duration", "100", "-o",
                        str(tmp_path / "o.jsonl"))
    assert result.returncode == 2 and "Invalid value for --duration" in said(result)
    assert "duration_s" not in said(result)


def test_writing_what_a_format_cannot_carry_is_said(tmp_path):
    """`--format azure` dropped a chat workload's prefix ids and sessions without a word (simulate's hit rate
    went from 0.61 to 0), and `-o x.csv` wrote JSON lines silently where `trace scale` warned."""
    result = fleetserve("trace", "generate", "chat", "--format", "azure", "-o", str(tmp_path / "c.csv"),
                        "--duration", "60")
    assert result.returncode == 0 and "prefix ids and sessions" in said(result) and "no run" in said(result)
    result = fleetserve("trace", "generate", "chat", "-o", str(tmp_path / "c2.csv"), "--duration", "60")
    assert result.returncode == 0 and "gets the mooncake format" in said(result)
    result = fleetserve("trace", "generate", "chat", "-o", str(tmp_path / "c3.jsonl"), "--duration", "60")
    assert result.returncode == 0 and "warning" not in said(result)
    # independent prompts' prefix ids never recur: an Azure copy loses nothing a cache could use
    result = fleetserve("trace", "generate", "diurnal", "--format", "azure", "-o", str(tmp_path / "d.csv"),
                        "--duration", "600")
    assert result.returncode == 0 and "warning" not in said(result)
    # an Azure trace's own clock does not survive a Mooncake copy: said, with the --start that restores it
    azure = tmp_path / "az.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0000000,100,10\n"
                     "2023-11-16 18:00:05.0000000,100,10\n")
    result = fleetserve("trace", "scale", str(azure), "--rate", "1", "--format", "mooncake", "-o",
                        str(tmp_path / "az.jsonl"))
    assert result.returncode == 0 and "carries no wall clock" in said(result)
    assert "--start 2023-11-16T18:00:00+00:00" in said(result)


def test_a_bad_file_under_servegen_options_and_a_chosen_format_are_said_plainly(tmp_path):
    """--duration on an empty or non-JSON file was a traceback; a ServeGen chunk file with a bad first row "is a
    azure trace"; and `-o x.csv --format mooncake` was told to choose another format with --format."""
    bad = tmp_path / "g.jsonl"
    bad.write_text("garbage\n")
    result = fleetserve("trace", "scale", str(bad), "--duration", "60", "--rate", "2", "-o", str(tmp_path / "x.jsonl"))
    assert result.returncode == 2 and "g.jsonl:1: not JSON" in said(result) and "Traceback" not in result.stderr
    (tmp_path / "e.jsonl").write_text("")
    result = fleetserve("trace", "scale", str(tmp_path / "e.jsonl"), "--model", "x", "-o", str(tmp_path / "y.jsonl"))
    assert result.returncode == 2 and "holds no request" in said(result)
    chunk = tmp_path / "chunk-9-trace.csv"
    chunk.write_text("0,1,1,Gamma,1\n")
    result = fleetserve("trace", "scale", str(chunk), "--format", "azure", "--duration", "60", "-o",
                        str(tmp_path / "o.csv"))
    assert result.returncode == 2 and "chunk-9-trace.csv:1: expected window_start_s" in said(result)
    result = fleetserve("trace", "generate", "chat", "-o", str(tmp_path / "w.csv"), "--format", "mooncake",
                        "--duration", "30")
    assert result.returncode == 0 and "which its name does not say" in said(result)
    assert "--format chooses another" not in said(result)


def test_a_compressed_clock_keeps_its_order_and_its_span(tmp_path):
    """Written in whole milliseconds, `--time 0.1` put every request of a 3 ms trace at 0 (and 2.5 ms read 2)."""
    src = tmp_path / "ms.jsonl"
    src.write_text("".join(f'{{"timestamp": {t}, "input_length": 10, "output_length": 5, "hash_ids": [{i}]}}\n'
                           for i, t in enumerate((0, 1, 3, 2.5))))
    out = tmp_path / "fast.jsonl"
    assert fleetserve("trace", "scale", str(src), "--time", "0.1", "-o", str(out)).returncode == 0
    assert sorted(r.arrival_s for r in load_trace(out)) == pytest.approx([0, 0.0001, 0.00025, 0.0003])
    same = tmp_path / "same.jsonl"
    assert fleetserve("trace", "scale", str(src), "--time", "1", "-o", str(same)).returncode == 0
    assert '"timestamp": 2.5' in same.read_text() and '"timestamp": 1,' in same.read_text()  # whole stays whole


def test_dash_writes_the_trace_to_standard_output(tmp_path):
    """`-o -` wrote a file named "-" in the current folder (and warned that its name did not say the format)."""
    made = fleetserve("trace", "generate", "chat", "-o", "-", "--duration", "5", "--seed", "1", cwd=tmp_path)
    assert made.returncode == 0 and not (tmp_path / "-").exists()
    rows = [json.loads(line) for line in made.stdout.splitlines()]
    assert rows and all("hash_ids" in r for r in rows) and "written to standard output" in made.stderr
    source = tmp_path / "t.jsonl"
    source.write_text(made.stdout)
    scaled = fleetserve("trace", "scale", str(source), "-o", "-", "--rate", "2", "--format", "azure", cwd=tmp_path)
    assert scaled.returncode == 0 and scaled.stdout.startswith("TIMESTAMP,ContextTokens,GeneratedTokens")
    assert "its name does not say" not in scaled.stderr and not (tmp_path / "-").exists()
