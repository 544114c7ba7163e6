from pathlib import Path

import numpy as np
import pytest

from fleetserve.traces.load import TraceError, detect_format, load_trace
from fleetserve.traces.servegen import RateWindow, read_clients, window_arrivals

DATA = Path(__file__).parent / "data" / "servegen"
CLIENT = DATA / "reason" / "deepseek-r1" / "chunk-1-trace.csv"


def test_one_client_follows_its_windows_rates():
    windows = read_clients(CLIENT)[0]
    reqs = load_trace(CLIENT, seed=3)
    assert detect_format(CLIENT) == "servegen"
    times = np.array([r.arrival_s for r in reqs])
    for w in windows[:12]:
        n = int(((times >= w.start_s) & (times < w.start_s + 600)).sum())
        assert n == int(np.ceil(w.rate_rps * 600))  # ServeGen's count per window
    assert load_trace(CLIENT, seed=3) == reqs and load_trace(CLIENT, seed=4) != reqs


def test_window_distribution_sets_burstiness():
    rng = np.random.default_rng(0)
    bursty = np.diff(window_arrivals(RateWindow(0, 2.0, 3.5, "Gamma", 0.08, 6.0), rng))
    smooth = np.diff(window_arrivals(RateWindow(0, 2.0, 1.0, "Weibull", 1.1, 0.5), rng))
    assert bursty.std() / bursty.mean() > 2.0 > 1.3 > smooth.std() / smooth.mean()


def test_folder_superposes_clients_and_slices_time():
    reqs = load_trace(DATA, model="deepseek-r1", start_s=3600, duration_s=3600, input_tokens=2000)
    expected = sum(np.ceil(w.rate_rps * 600) for c in read_clients(DATA) for w in c if 3600 <= w.start_s < 7200)
    assert len(reqs) == expected and all(0 <= r.arrival_s < 3600 and r.input_tokens == 2000 for r in reqs)
    assert len(load_trace(DATA, limit=10)) == 10
    with pytest.raises(TraceError, match="allowed: reason/deepseek-r1"):
        load_trace(DATA, model="m-large")


def test_aggregate_file(tmp_path):
    agg = tmp_path / "agg.csv"
    agg.write_text("model,window_start_s,total_rate_rps,active_clients\na/x,0,1.0,3\na/x,600,3.0,3\nb/y,0,5,1\n")
    with pytest.raises(TraceError, match="allowed: a/x, b/y"):
        load_trace(agg)
    reqs = load_trace(agg, model="a/x")
    first = sum(r.arrival_s < 600 for r in reqs)
    assert 500 < first < 700 and 1600 < len(reqs) - first < 2000


def test_simulating_a_rate_file_says_its_request_sizes_are_not_the_traces():
    """ServeGen's rate files carry no sizes: every request got 1,024/128 tokens and nothing said so."""
    from tests.helpers import fleetserve

    spec = Path(__file__).parents[2] / "examples" / "simulated-cloud.yaml"
    result = fleetserve("simulate", str(spec), "--trace", str(CLIENT), "--limit", "20", "--json")
    said = " ".join(result.stderr.split())
    assert result.returncode == 0 and "ServeGen rate files carry arrivals only" in said, result.stderr
    assert "1024 prompt and 128 output tokens" in said


@pytest.mark.parametrize("row, says", [
    ("0,nan,1.0,,0,0", "rate_rps must be a finite number >= 0, got nan"),  # a numpy traceback, exit 1
    ("0,-1,1.0,,0,0", "rate_rps must be a finite number >= 0, got -1.0"),  # silently no requests
    ("0,0.5,1.0,Gamma,inf,2", "shape must be"),
    ("0,0.5,4.0,Lognormal,0.5,2", "dist 'Lognormal' is not a distribution; allowed: Gamma, Weibull"),
    ("0,0.5,4.0,Gamma,0,2", "a Gamma window needs shape and scale above 0, got 0 and 2"),  # became Poisson
    ("0,1e12,1.0,,0,0", "rate_rps 1e.12 makes 600,000,000,000,000 requests"),  # a numpy MemoryError with --limit
])
def test_rate_rows_that_cannot_be_drawn_from_are_refused_naming_the_line(tmp_path, row, says):
    path = tmp_path / "chunk-0-trace.csv"
    path.write_text("0,0.5,1.0,,0,0\n" + row + "\n")
    with pytest.raises(TraceError, match=f"chunk-0-trace.csv:2: {says}"):
        load_trace(path)
    agg = tmp_path / "agg.csv"
    agg.write_text("model,window_start_s,total_rate_rps,active_clients\na/x,0,1.0,3\na/x,600,nan,3\n")
    with pytest.raises(TraceError, match="agg.csv:3: rate_rps must be a finite number"):
        load_trace(agg)


def test_a_bom_a_header_row_and_the_distributions_case_are_read(tmp_path):
    """A BOM made the first row "not a rate row"; `weibull` silently became Poisson; a header row sent the file
    to the Azure reader."""
    rows = "0,0.5,4.03,Weibull,0.3,0.5\n600,0.5,4.03,Weibull,0.3,0.5\n"
    canonical = tmp_path / "a.csv"
    canonical.write_text(rows)
    variants = {"bom.csv": "\ufeff" + rows, "lower.csv": rows.replace("Weibull", "weibull"),
                "header.csv": "window_start_s,rate_rps,cv,dist,shape,scale\n" + rows}
    expected = load_trace(canonical, seed=1)
    assert len(expected) == 600  # ceil(0.5 x 600) per window: Weibull, not a Poisson draw
    for name, text in variants.items():
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        assert detect_format(path) == "servegen", name
        assert load_trace(path, seed=1) == expected, name


def test_a_file_that_starts_late_replays_from_its_first_busy_window(tmp_path):
    """Windows from 43,200 s (noon) kept their offset: 12 hours of an empty fleet were simulated and paid for."""
    late = tmp_path / "late.csv"
    late.write_text("42600,0,1.0,,0,0\n43200,0.5,1.0,,0,0\n43800,0.5,1.0,,0,0\n")
    early = tmp_path / "early.csv"
    early.write_text("0,0.5,1.0,,0,0\n600,0.5,1.0,,0,0\n")
    reqs, same = load_trace(late, seed=2), load_trace(early, seed=2)
    assert len(reqs) == len(same) and reqs[-1].arrival_s < 1200
    assert [r.arrival_s for r in reqs] == pytest.approx([r.arrival_s for r in same])
    # an explicit start inside the trace counts from there; a duration counts from where the replay starts
    assert all(0 <= r.arrival_s < 900 for r in load_trace(late, seed=2, start_s=43500))
    assert load_trace(late, seed=2, duration_s=3600) == reqs  # it was empty: the hour counted from 0 s
    part = load_trace(late, seed=2, start_s=43000, duration_s=600)
    assert part[-1].arrival_s > 500 and all(r.arrival_s < 600 for r in part)
    with pytest.raises(TraceError, match="no requests: no window from 44400 s on has a rate above 0"):
        load_trace(late, start_s=44400)
    zero = tmp_path / "zero.csv"
    zero.write_text("0,0,1.0,,0,0\n600,0,1.0,,0,0\n")
    with pytest.raises(TraceError, match="no requests: every window's rate is 0"):
        load_trace(zero)


def test_a_folder_is_read_as_servegen_lays_it_out_never_deeper(tmp_path):
    """`--trace /tmp` searched the whole tree and took chunk files of unrelated checkouts (test fixtures three and
    more folders down) for one model's clients."""
    import shutil

    deep = tmp_path / "checkout" / "tests" / "data" / "servegen"
    shutil.copytree(DATA, deep)
    with pytest.raises(TraceError, match="without ServeGen rate files"):
        load_trace(tmp_path)
    assert load_trace(deep, limit=5) and load_trace(deep / "reason", limit=5) and \
        load_trace(deep / "reason" / "deepseek-r1", limit=5)


def test_unreadable_rate_files_are_trace_errors_naming_the_file(tmp_path):
    """Bytes that are not UTF-8 (a file, or one inside a folder or a .tar.gz), a .tar.gz that is no tar archive,
    and an aggregate file of a header alone had ended in tracebacks, or blamed a --model nobody gave."""
    import gzip
    import tarfile

    bad = tmp_path / "chunk-1-trace.csv"
    bad.write_bytes(b"0,1,1,,0,0\n\xff\n")
    with pytest.raises(ValueError, match=r"chunk-1-trace.csv:2: not UTF-8 text"):
        read_clients(bad)
    folder = tmp_path / "folder" / "cat" / "model"
    folder.mkdir(parents=True)
    (folder / "chunk-1-trace.csv").write_bytes(bad.read_bytes())
    with pytest.raises(ValueError, match=r"chunk-1-trace.csv:2: not UTF-8 text"):
        read_clients(tmp_path / "folder")
    archive = tmp_path / "rates.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder / "chunk-1-trace.csv", arcname="cat/model/chunk-1-trace.csv")
    with pytest.raises(ValueError, match=r"chunk-1-trace.csv:2: not UTF-8 text"):
        read_clients(archive)
    fake = tmp_path / "fake.tar.gz"
    fake.write_bytes(gzip.compress(b'{"timestamp": 0, "input_length": 5, "output_length": 1}\n'))
    with pytest.raises(TraceError, match=r"fake.tar.gz is not a readable tar archive"):
        load_trace(fake)
    header = tmp_path / "aggregate.csv"
    header.write_text("model,window_start_s,total_rate_rps,active_clients\n")
    with pytest.raises(TraceError, match=r"no rows after the header") as info:
        load_trace(header)
    assert "model" not in (info.value.param or "")


def test_a_model_folder_is_that_models_and_the_archives_top_folder_is_read(tmp_path):
    """`--trace-model deepseek-r1` on the model's own folder was refused as an unknown model with nothing allowed
    (its files were named without the folder), and the archive once extracted (TOP/CATEGORY/MODEL/, as the .tar.gz
    is laid out) was refused at its top while the .tar.gz was read."""
    import shutil

    model = DATA / "reason" / "deepseek-r1"
    whole = load_trace(model, limit=5)
    assert load_trace(model, model="deepseek-r1", limit=5) == whole
    assert load_trace(model, model="reason/deepseek-r1", limit=5) == whole
    with pytest.raises(TraceError, match=r"unknown ServeGen model 'qwen'; allowed: reason/deepseek-r1"):
        load_trace(model, model="qwen")
    top = tmp_path / "extracted" / "servegen_rate_traces"
    shutil.copytree(DATA, top)
    assert load_trace(tmp_path / "extracted", model="deepseek-r1", limit=5) == whole


def test_a_rate_scale_scales_the_rates_before_arrivals_are_drawn(tmp_path):
    """A 14-day rate file of 237 million requests was refused for its size before `--rate-scale 0.001` thinned it,
    and the way out the error named (--limit) kept its first 25 seconds: the scale now applies to the rates."""
    from tests.helpers import fleetserve

    agg = tmp_path / "agg.csv"
    rows = "".join(f"a/x,{600 * i},1000.0,3\n" for i in range(10))  # 6 million requests at 1 x
    agg.write_text("model,window_start_s,total_rate_rps,active_clients\n" + rows)
    with pytest.raises(TraceError, match="about 6,000,000 requests; give a smaller rate scale, or a limit"):
        load_trace(agg, model="a/x")
    thinned = load_trace(agg, model="a/x", rate_scale=0.001)  # 1 request/s x 6,000 s
    assert 5_800 < len(thinned) < 6_200 and thinned[-1].arrival_s > 5_900  # all of the file's span, thinned
    assert load_trace(agg, model="a/x", rate_scale=0.001, seed=1) != thinned
    # a chunk file's Gamma and Weibull windows: their count is rounded up at 1 x (ServeGen's), at random when
    # scaled (rounded up, 0.001 x kept one request in every busy window of every client: 95 where 14 were due)
    whole = len(load_trace(DATA, model="deepseek-r1"))
    assert 3 <= len(load_trace(DATA, model="deepseek-r1", rate_scale=0.001)) <= 30 < whole // 100
    with pytest.raises(TraceError, match="a rate scale of 10 makes 6,000,000 requests in one 600 s window"):
        load_trace(agg, model="a/x", rate_scale=10, limit=5)  # one window is drawn at once, whatever the limit
    with pytest.raises(TraceError, match="a rate scale of 1e-09 leaves none"):
        load_trace(agg, model="a/x", rate_scale=1e-9, duration_s=600)
    out = tmp_path / "out.csv"
    done = fleetserve("trace", "scale", str(agg), "--model", "a/x", "--rate", "0.001", "-o", str(out))
    assert done.returncode == 0 and 5_800 < len(out.read_text().splitlines()) - 1 < 6_200, done.stderr
    spec = Path(__file__).parents[2] / "examples" / "simulated-cloud.yaml"
    simulated = fleetserve("simulate", str(spec), "--trace", str(agg), "--trace-model", "a/x", "--rate-scale", "0.001",
                           "--json")
    assert simulated.returncode == 0, simulated.stderr
    import json

    assert json.loads(simulated.stdout)["requests"] == len(thinned)  # the same draw (seed 0) as the loader's
