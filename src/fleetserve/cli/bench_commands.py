"""CLI: the `bench` commands that start real processes (chaos, scale-from-zero, engine-start, routing, the router's
overhead, stacks and workers, kvcache, replay, fidelity). Added to the main app as `bench` (`app.add_typer`;
`sim_commands` adds `sim-speed`); figures are printed as JSON on stdout, progress on stderr, and bad flags exit 2
naming the flag and allowed values."""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer

from fleetserve.cli.checks import float_option, peer_python
from fleetserve.cli.console import EXIT_USAGE, Terminated, err, fail, out, say

bench_app = typer.Typer(help="Benchmarks with real processes; figures as JSON.", no_args_is_help=True)


@bench_app.callback()
def _stop_cleanly_on_sigterm(ctx: typer.Context) -> None:
    """SIGTERM ends a bench as Ctrl-C does: its processes stopped and its temporary folder (a model, tokens, a
    Redis password) removed; Python's default SIGTERM exit skipped both (the folders stayed behind). A second
    SIGTERM does not cut the stop under way; the exit code is 143. The handler is the command's only."""
    import signal

    def stop(_signum, _frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    ctx.call_on_close(lambda: signal.signal(signal.SIGTERM, previous))


def peer(given: str | None, module: str, flag: str, variable: str) -> str | None:
    """A peer router's Python from its flag, else from its environment variable, checked alike (a wrong path in
    the variable still failed the peer's row after minutes)."""
    if given is not None:
        return peer_python(given, module, flag)
    return peer_python(os.environ.get(variable) or None, module, variable)


def _figures(result: dict, lost) -> None:
    """The bench's figures as JSON on stdout; exit 1 when it lost a request or a check failed (truthy `lost`)."""
    print(json.dumps(result, indent=2))
    if lost:
        raise typer.Exit(1)


# the names of bench/chaos.SCENARIOS, for the help (a test holds them equal; importing the module here would
# load the fleet's whole code for every command's help)
CHAOS_SCENARIOS = ("replica_sigkill", "redis_sigkill", "overload_10x", "slow_replica", "poisoned_request",
                   "huge_prompts", "scale_from_zero_burst", "supervisor_sigkill_then_up")


@bench_app.command("chaos")
def bench_chaos(
    scenarios: Annotated[str | None, typer.Option(help="Comma-separated scenarios (default: all): "
                                                       + ", ".join(CHAOS_SCENARIOS))] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON figures")] = False,
) -> None:
    """One fault at a time against a real local fleet: what was answered, shed, cut or lost (must be 0)."""
    from fleetserve.bench.chaos import SCENARIOS, run

    names = None
    if scenarios is not None:  # "" or "," named none: all eight had run
        names = list(dict.fromkeys(n.strip() for n in scenarios.split(",") if n.strip()))
        if not names:
            raise typer.BadParameter(f"{scenarios!r} names no scenario; allowed values: {', '.join(SCENARIOS)}",
                                     param_hint="--scenarios")
    bad = [n for n in names or [] if n not in SCENARIOS]
    if bad:
        raise typer.BadParameter(f"{bad[0]!r}; allowed values: {', '.join(SCENARIOS)}", param_hint="--scenarios")
    result = run(names, progress=lambda name: None if as_json else err.print(f"scenario {name} ...",
                                                                                markup=False))
    if not as_json:
        for name, r in result["scenarios"].items():
            out.print(f"{name}: sent {r['sent']}, answered {r['answered']}, shed {r['rejected_with_retry_after']}, "
                      f"cut {r['cut_with_error_event']}, failed {r['failed_with_error']}, refused {r['refused']}, "
                      f"lost {r['lost']}, recovery {r['recovery_s']}s", markup=False)
    for check in result["checks_failed"]:
        err.print(f"check failed: {check}", markup=False)
    _figures(result, result["lost_total"] or result["checks_failed"])


@bench_app.command("scale-from-zero")
def bench_scale_from_zero(
    model: Annotated[str, typer.Option(help="tiny (random test model), demo (SmolLM2) or a model source")] = "tiny",
    requests: Annotated[int | None, typer.Option(min=1, max=1024, help="Requests in the burst (default: ten "
                                                                          "times --buffer)")] = None,
    buffer: Annotated[int, typer.Option(min=1, max=256, help="The router's wait buffer at zero replicas")] = 8,
    max_tokens: Annotated[int, typer.Option(min=1)] = 8,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON figures")] = False,
) -> None:
    """A fleet at zero replicas gets a burst: cold start, first response, lost requests (must be 0)."""
    from fleetserve.bench.scale_from_zero import run

    _check_bench_model(model)
    try:
        result = run(model, requests, max_tokens, buffer)
    except RuntimeError as exc:
        raise fail(str(exc), 1) from None
    if not as_json:
        out.print(f"cold start {result['cold_start_s']}s, first response {result['first_response_s']}s "
                  f"(warm {result['warm']['first_response_s']}s), {result['requests']} requests, "
                  f"{result['lost']} lost", markup=False)
    if result["unanswered"]:  # a failed run, whatever `lost` says (a response time may be missing)
        why = result["fleet_error"] or f"status codes {result['status_codes']}"
        err.print(f"error: {result['unanswered']} of {result['sent']} request(s) did not end answered: {why}",
                  markup=False)
    _figures(result, result["lost"] or result["unanswered"])


@bench_app.command("engine-start")
def bench_engine_start(
    model: Annotated[str, typer.Option(help="tiny (random test model), demo (SmolLM2) or a model source")] = "tiny",
    starts: Annotated[int, typer.Option(min=1, max=50, help="Measured starts of each kind")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON figures")] = False,
) -> None:
    """A replica's start to /health 200: forked from the engine fork server against a new interpreter."""
    from fleetserve.bench.engine_start import run

    _check_bench_model(model)
    try:
        result = run(model, starts, progress=lambda line: None if as_json else err.print(line, markup=False))
    except RuntimeError as exc:
        raise fail(str(exc), 1) from None
    if not as_json:
        out.print(f"replica start to /health: {result['plain_s']['p50']}s as a new interpreter, "
                  f"{result['forked_s']['p50']}s forked (x{result['ratio']['forked_vs_plain_p50']}); the fork "
                  f"server's imports {result['fork_server_ready_s']}s, once per fleet", markup=False)
    _figures(result, False)


@bench_app.command("routing")
def bench_routing(
    trace: Annotated[str, typer.Option(help="Trace file (Mooncake JSONL, Azure CSV, prompt log)")],
    replicas: Annotated[int, typer.Option(min=1, max=32)] = 4,
    strategies: Annotated[str, typer.Option(help="Comma-separated strategies")] =
        "roundrobin,leastload,session,prefixaware,kvaware",
    limit: Annotated[int | None, typer.Option(min=1, help="First N requests of the trace (default: all; "
                                                          "--live: 600)")] = None,
    modes: Annotated[str, typer.Option(help="Router modes, comma-separated: blind (no KV events, capacity or "
                                            "queue), informed")] = "blind,informed",
    cache_fraction: Annotated[float, float_option(min=0.001, max=1.0, help="The fleet's KV caches together hold "
                                                                           "this share of the trace's blocks")
                              ] = 1 / 3,
    target_utilization: Annotated[float | None, float_option(
        min=0.01, max=0.99, help="Arrival times are scaled so that roundrobin keeps the fleet this busy (0.65; "
                                  "a share of its time: at most 0.99)")
                                  ] = None,
    time_scale: Annotated[float | None, float_option(min=0.0001, max=1e4, help="Scale arrival times by this "
                                                                               "instead")] = None,
    sweep: Annotated[str, typer.Option(help="More utilizations for the blind-mode targets, comma-separated "
                                            "('' for none)")] = "0.8,0.9",
    seed: Annotated[int, typer.Option(min=0, help="Simulator seed: its random draws and the routing policies' "
                                           "tie-breaks (0: the live router's own); another seed shows how much "
                                           "of a figure is the draw")] = 0,
    live: Annotated[bool, typer.Option("--live", help="Real time: simulated engine processes behind a real "
                                                      "router (minutes)")] = False,
    duration: Annotated[float, float_option(min=1, help="--live: wall-clock seconds per strategy")] = 60,
    profile: Annotated[str, typer.Option(help="Engine performance profile")] = "h100-8b",
    max_output: Annotated[int | None, typer.Option(min=1, help="Cap on output tokens per request (--live: 256)")
                          ] = None,
    prompt_format: Annotated[str, typer.Option(help="--live: tokens (exact KV keys) or text (for text-only "
                                                    "routers)")] = "tokens",
    sglang_python: Annotated[str | None, typer.Option(help="--live: Python with sglang-router, for the "
                                                           "sglang_cache_aware row")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON figures")] = False,
) -> None:
    """Routing strategies side by side on one trace: hit rate against the oracle, TTFT, load skew.

    By default on the fleet simulator (the whole trace in seconds, every strategy, blind and informed
    router); --live replays it in real time against simulated engine processes behind the real router. With
    --live, add `sglang_cache_aware` to --strategies (and --prompt-format text: sglang-router takes text
    prompts only) to compare with sglang-router's cache_aware policy on the same engines and trace."""
    from fleetserve.bench.routing import SGLANG, find_sglang_python, run
    from fleetserve.router.policies import registered_policies
    from fleetserve.sim.setup import KNOWLEDGE_MODES
    from fleetserve.traces.load import TraceError

    names = _bench_configs(strategies, (*registered_policies(), SGLANG) if live else registered_policies(),
                           "--strategies")
    if target_utilization is not None and time_scale is not None:
        raise typer.BadParameter("give one: --time-scale fixes the arrival times that --target-utilization would "
                                 "choose", param_hint="--target-utilization/--time-scale")
    target_utilization = 0.65 if target_utilization is None else target_utilization
    if prompt_format not in ("tokens", "text"):
        raise typer.BadParameter(f"{prompt_format!r}; allowed values: tokens, text", param_hint="--prompt-format")
    if not live:
        from fleetserve.bench.routing_sim import run as run_sim
        from fleetserve.sim.profiles import ProfileError

        for flag, given, default in (("--duration", duration, 60), ("--prompt-format", prompt_format, "tokens"),
                                     ("--sglang-python", sglang_python, None)):
            if given != default:  # they were accepted and did nothing (the reverse is refused too)
                raise typer.BadParameter("applies to --live only (the real-time bench): the simulator bench runs the "
                                         "whole trace in simulated time, keyed by its token ids", param_hint=flag)

        mode_names = _bench_configs(modes, KNOWLEDGE_MODES, "--modes")
        parts = [u.strip() for u in sweep.split(",")] if sweep.strip() else []
        try:
            if any(not u for u in parts):  # "0.8,,0.9" or ",,": a typo, not "no sweep"
                raise ValueError(sweep)
            loads = tuple(float(u) for u in parts)
        except ValueError:
            raise typer.BadParameter(f"{sweep!r}; allowed values: utilizations such as 0.8,0.9 (or '')",
                                     param_hint="--sweep") from None
        if any(not 0.01 <= u <= 0.99 for u in loads):  # a share of the fleet's time: a fleet is never 1.5 busy
            raise typer.BadParameter(f"{sweep!r}; each utilization must be within 0.01..0.99", param_hint="--sweep")
        if len({f"{u:g}" for u in loads}) != len(loads):  # the sweep's keys: 0.8 and 0.8000001 are one
            raise typer.BadParameter(f"{sweep!r}: a utilization given twice", param_hint="--sweep")
        try:
            result = run_sim(trace, replicas, names, mode_names, limit, profile, cache_fraction, target_utilization,
                             time_scale, max_output, seed, progress=None if as_json else say,
                             sweep_utilizations=loads)
        except ProfileError as exc:
            raise fail(f"--profile: {exc}", EXIT_USAGE) from None
        except TraceError as exc:
            raise fail(str(exc), EXIT_USAGE, fallback="--trace") from None
        except (ValueError, OSError) as exc:
            raise fail(str(exc), EXIT_USAGE) from None
        for warning in result["warnings"]:
            err.print(f"warning: {warning}", markup=False)
        print(json.dumps(result, indent=2))
        return
    if SGLANG in names and prompt_format != "text":
        raise typer.BadParameter("sglang-router accepts text prompts only: add --prompt-format text",
                                 param_hint="--prompt-format")
    if time_scale is not None:  # the live bench fits the trace into --duration and sets the engines' speed
        raise typer.BadParameter("applies to the simulator; --live replays the trace in --duration seconds at "
                                 "--target-utilization", param_hint="--time-scale")
    for flag, given, default in (("--modes", modes, "blind,informed"), ("--sweep", sweep, "0.8,0.9"),
                                 ("--seed", seed, 0)):
        if given != default:  # the live bench runs the real router once per strategy: no modes, sweep or draws
            raise typer.BadParameter("applies to the simulator, not to --live (the real router, engine processes, "
                                     "one run per strategy)", param_hint=flag)
    from fleetserve.sim.perf import profile as perf_profile
    from fleetserve.sim.profiles import ProfileError

    try:
        perf_profile(profile)
    except ProfileError as exc:
        raise fail(f"--profile: {exc}", EXIT_USAGE) from None
    sglang = find_sglang_python(peer(sglang_python, "sglang_router", "--sglang-python", "FLEETSERVE_SGLANG_PYTHON"))
    if SGLANG in names and sglang is None:  # it was said after the strategies before it had run, and lost them
        raise typer.BadParameter("sglang_cache_aware needs sglang-router: pip install sglang-router==0.3.2, or give "
                                 "--sglang-python (or FLEETSERVE_SGLANG_PYTHON) a Python that has it",
                                 param_hint="--strategies")
    try:
        result = run(trace, replicas, names, limit or 600, duration, cache_fraction=cache_fraction,
                     target_utilization=target_utilization, profile_name=profile,
                     max_output=max_output or 256, progress=None if as_json else say, prompt_format=prompt_format,
                     sglang_python=sglang)
    except (TraceError, ValueError) as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    except RuntimeError as exc:  # an engine or router process that did not come up: its log's tail, no traceback
        raise fail(str(exc), 1) from None
    for warning in result["warnings"]:
        err.print(f"warning: {warning}", markup=False)
    print(json.dumps(result, indent=2))


@bench_app.command("router-overhead")
def bench_router_overhead(
    seconds: Annotated[float, float_option(min=1, help="Length of each wrk run (after a 1 s warm-up)")] = 5.0,
    configs: Annotated[str | None, typer.Option(help="Comma-separated configurations (default: all)")] = None,
    sglang_python: Annotated[str | None, typer.Option(help="Python with sglang-router, to measure it beside")
                             ] = None,
    vllm_python: Annotated[str | None, typer.Option(help="Python with vllm-router, to measure it beside")
                           ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON figures")] = False,
) -> None:
    """Each router's req/s, p50/p99 (32 connections), added p50 (1 connection) and CPU per request, by wrk."""
    from fleetserve.bench.router_overhead import NAMES, run
    from fleetserve.bench.wrkbench import WrkMissing

    names = _bench_configs(configs, NAMES, "--configs")
    sglang_python = peer(sglang_python, "sglang_router", "--sglang-python", "FLEETSERVE_SGLANG_PYTHON")
    vllm_python = peer(vllm_python, "vllm_router", "--vllm-python", "FLEETSERVE_VLLM_ROUTER_PYTHON")
    try:
        result = run(seconds, names, sglang_python, progress=None if as_json else say, vllm_python=vllm_python)
    except WrkMissing as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    print(json.dumps(result, indent=2))


@bench_app.command("router-stacks")
def bench_router_stacks(
    seconds: Annotated[float, float_option(min=1, help="Length of each wrk run (after a 1 s warm-up)")] = 5.0,
    stacks: Annotated[str | None, typer.Option(help="Comma-separated stacks (default: all)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON figures")] = False,
) -> None:
    """The same minimal proxy on each candidate HTTP stack, and the real gateway, measured by wrk."""
    from fleetserve.bench.router_stacks import NAMES, run
    from fleetserve.bench.wrkbench import WrkMissing

    names = _bench_configs(stacks, NAMES, "--stacks")
    try:
        result = run(seconds, names, progress=None if as_json else say)
    except WrkMissing as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    print(json.dumps(result, indent=2))


@bench_app.command("router-workers")
def bench_router_workers(
    strategies: Annotated[str, typer.Option(help="Comma-separated cache-aware strategies")] = "prefixaware,kvaware",
    requests: Annotated[int, typer.Option(min=2, help="Requests replayed per configuration")] = 300,
    replicas: Annotated[int, typer.Option(min=1, max=32, help="Simulated engines behind the router")] = 4,
    duration: Annotated[float, float_option(min=1, help="Wall-clock seconds the replay is compressed into")] = 20.0,
    trace: Annotated[str, typer.Option(help="chat, system-prompt or rag (generated), or a trace file (Mooncake "
                                            "JSONL, Azure CSV, prompt log)")] = "chat",
    max_tokens: Annotated[int, typer.Option(min=1, help="Output tokens per request at most")] = 8,
    seed: Annotated[int, typer.Option(min=0, help="Seed of a generated trace")] = 0,
    logs: Annotated[str | None, typer.Option(help="Keep the engines' and routers' logs in this folder")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON figures")] = False,
) -> None:
    """Cache hit rate with `router --workers 2` against `--workers 1`: same trace, fresh simulated engines each."""
    from fleetserve.bench.router_workers import STRATEGIES, run
    from fleetserve.traces.load import TraceError

    names = _bench_configs(strategies, STRATEGIES, "--strategies")
    try:
        result = run(names, requests, replicas, duration, trace, max_tokens, seed, logs,
                     progress=None if as_json else say)
    except TraceError as exc:
        raise fail(f"--trace: {exc} (or a generated trace: chat, system-prompt, rag)", EXIT_USAGE) from None
    except OSError as exc:
        flag = "--logs" if logs and exc.filename and str(exc.filename).startswith(logs) else "--trace"
        raise fail(f"{flag}: {exc}", EXIT_USAGE) from None
    except ValueError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    except RuntimeError as exc:
        raise fail(str(exc), 1) from None
    if not as_json:
        for name, row in result["strategies"].items():
            out.print(f"{name}: hit rate {row['hit_rate']['workers_1']} (1 worker) -> {row['hit_rate']['workers_2']} "
                      f"(2 workers), loss {row['loss_pct']}%, worker requests {row['worker_requests']}",
                      markup=False)
    # requests that failed or got no answer: the hit rates are of what was served, and a run whose requests all
    # failed (chats sent to /v1/completions) had exited 0 with a null ratio
    broken = {f"{name} with {k.replace('_', ' ')}": f"{row['answered'][k]} of {row['requests']} answered "
              f"({row['failed'][k]} failed, {row['lost'][k]} lost)"
              for name, row in result["strategies"].items() for k in row["failed"]
              if row["failed"][k] or row["lost"][k] or not row["answered"][k]}
    for where, what in broken.items():
        err.print(f"error: {where}: {what}", markup=False)
    _figures(result, broken)


def _bench_configs(value: str | None, allowed: tuple[str, ...], hint: str) -> tuple[str, ...]:
    """A comma-separated choice of `allowed` (None: all), each once in the order given (a name given twice had
    run twice under one key)."""
    if value is None:
        return allowed
    names = tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise typer.BadParameter(f"{', '.join(unknown) or value!r}; allowed values: {', '.join(allowed)}",
                                 param_hint=hint)
    return names


def _check_bench_model(model: str) -> None:
    """--model of a bench that starts engines: tiny, demo, or a source that can exist (a path is checked here;
    the engine's own error was a traceback, or exit 1 without naming the flag)."""
    from pathlib import Path

    from fleetserve.engine.sources import ModelSourceError, check_model_dir
    from fleetserve.spec.endpoint import SOURCE_SCHEMES

    if model.startswith("catalog:"):  # the catalog is known here: an unknown name had exited 1 after a fleet start
        from fleetserve.engine.catalog import preset

        try:
            preset(model.removeprefix("catalog:"))
        except KeyError as exc:
            raise typer.BadParameter(str(exc.args[0]), param_hint="--model") from None
        return
    if model in ("tiny", "demo") or model.startswith(("builtin:", "hf:", "s3://")):
        return
    try:
        check_model_dir(Path(model).expanduser())
    except ModelSourceError as exc:
        raise typer.BadParameter(f"{exc}; allowed values: tiny, demo, or a model source "
                                 f"({', '.join(SOURCE_SCHEMES)})", param_hint="--model") from None


@bench_app.command("kvcache")
def bench_kvcache(
    model: Annotated[str, typer.Option(help="tiny (random, 4 layers), demo (SmolLM2) or a model source")] = "tiny",
    repeats: Annotated[int, typer.Option(min=1, help="Measurements per figure (median)")] = 3,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16 or float16")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON figures (no progress lines)")] = False,
) -> None:
    """TTFT with a 2,048-token prefix cold / in the engine / in L1 / in L2, and decode throughput b1 vs b8."""
    from fleetserve.bench.kvcache import ModelUnfit, run

    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise typer.BadParameter(f"{dtype!r}; allowed values: auto, float32, bfloat16, float16", param_hint="--dtype")
    _check_bench_model(model)
    try:
        result = run(model, repeats, dtype=dtype, progress=None if as_json else say)
    except ModelUnfit as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    except RuntimeError as exc:  # the engine did not start: its own error, not a traceback
        raise fail(str(exc), 1) from None
    print(json.dumps(result, indent=2))
    for error in result["errors"]:  # a tier that served nothing: its figure is not published as measured
        err.print(f"error: {error}", markup=False)
    if result["errors"]:
        raise typer.Exit(1)


@bench_app.command("replay")
def bench_replay(
    url: Annotated[str, typer.Option(help="Gateway base URL (http://host:port; the /v1 that `up` prints may stay)")],
    trace: Annotated[str, typer.Option(help="Trace file (Mooncake JSONL, Azure CSV, prompt log)")],
    model: Annotated[str, typer.Option(help="Model name to send")],
    speedup: Annotated[float, float_option(min=0.001, help="Replay this many times faster than recorded")] = 1.0,
    limit: Annotated[int | None, typer.Option(min=1, help="First N requests of the file, in file order")] = None,
    stream: Annotated[bool, typer.Option(help="Stream (client-side TTFT/ITL)")] = True,
    max_output: Annotated[int | None, typer.Option(min=1, help="Cap on output tokens")] = None,
    api_key_env: Annotated[str, typer.Option(help="Environment variable holding the API key to send, for a fleet "
                                                  "with spec.auth (unset: no key)")] = "OPENAI_API_KEY",
    vocab: Annotated[int | None, typer.Option(min=2, help="Fold a Mooncake or Azure trace's token ids into a "
                                                          "vocabulary this small (a tiny model's: ids outside it are "
                                                          "a 400)")] = None,
    prompt_format: Annotated[str, typer.Option(help="How a Mooncake or Azure trace's prompts are sent: tokens "
                                                    "(token ids) or text (one word per token)")] = "tokens",
) -> None:
    """Replay a trace against a running endpoint; prints TTFT, TPOT, ITL, E2E percentiles and hit rates. Exit 1
    when a request got no answer at all (lost), its connection was refused, or none was answered."""
    import asyncio

    from fleetserve.bench.replay import replay, summarize
    from fleetserve.router.upstream import backend_url_problem
    from fleetserve.traces.load import TraceError, read_trace

    if (problem := backend_url_problem(url, allow_path=True)) is not None:  # `:abc` as the port: a traceback
        raise typer.BadParameter(f"{problem} (the gateway; the /v1 that `up` prints may stay)", param_hint="--url")
    if prompt_format not in ("tokens", "text"):
        raise typer.BadParameter(f"{prompt_format!r}; allowed values: tokens, text", param_hint="--prompt-format")
    try:
        requests, _, notes = read_trace(trace, limit)
    except TraceError as exc:
        raise fail(f"--trace: {exc}", EXIT_USAGE) from None
    for note in notes:
        err.print(f"warning: {note}", markup=False)
    if requests and all(r.messages or r.prompt for r in requests):  # a prompt log sends its own text
        for flag, given in (("--vocab", vocab is not None), ("--prompt-format", prompt_format != "tokens")):
            if given:  # accepted and ignored, it had changed nothing without a word
                raise typer.BadParameter(f"applies to Mooncake and Azure traces only; {trace} is a prompt log, "
                                         "whose requests are sent as they are", param_hint=flag)
    base = url.rstrip("/")  # the endpoint `up` and `status` print ends in /v1: it went to /v1/v1/... (404s)
    base = base[:-3] if base.endswith("/v1") else base
    from urllib.parse import urlsplit

    if urlsplit(base).path.strip("/"):  # an endpoint's full path: the requests went to .../v1/completions/v1/...
        raise typer.BadParameter(f"{url}: the gateway's base URL (http://host:port, or with /v1), not an endpoint's "
                                 "path", param_hint="--url")
    records = asyncio.run(replay(base, requests, model=model, speedup=speedup, stream=stream,
                                 max_output=max_output, api_key=os.environ.get(api_key_env) or None,
                                 prompt_format=prompt_format, vocab=vocab))
    summary = summarize(records)
    print(json.dumps(summary, indent=2))
    if not stream and summary.get("answered") and summary["ttft_ms"].get("p50") is None:
        err.print("note: non-streamed answers carry no time to the first token (only a simulated engine reports "
                  "one in fleetserve_timing): ttft_ms, tpot_ms and itl_ms need --stream", markup=False)
    if summary.get("refused"):  # nothing listened: the endpoint was down, which no figure beside it describes
        tls = any(r.refused and "SSL" in (r.error or "") for r in records)
        unresolved = any(r.unresolved for r in records)
        why = ("the TLS handshake failed (https to a plain-HTTP gateway, or the reverse?)" if tls else
               f"the host name of {url} does not resolve" if unresolved else f"nothing listened at {url}")
        err.print(f"{summary['refused']} of {summary['requests']} request(s) refused: {why}", markup=False)
    if summary.get("lost"):  # no answer at all, or a stream cut without its end: the endpoint lost requests
        err.print(f"{summary['lost']} of {summary['requests']} request(s) got no answer (lost)", markup=False)
    if (records and not summary.get("answered")) or summary.get("refused") or summary.get("lost"):
        raise typer.Exit(1)  # nothing answered is a failed replay, not figures; so is a request refused or lost


FIDELITY_MAX_RATE = 20  # requests/s per replica of the tiny model that `bench fidelity` accepts


@bench_app.command("fidelity")
def bench_fidelity(
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON (the only output)")] = True,
    requests: Annotated[int, typer.Option(min=2, max=100_000, help="Requests in the generated trace")] = 480,
    duration: Annotated[float, float_option(min=1.0, help="Seconds the trace spans")] = 160.0,
    seed: Annotated[int, typer.Option(min=0, help="Trace seed")] = 7,
    replicas: Annotated[int, typer.Option(min=1, max=8, help="Replicas of the tiny model")] = 2,
    simulated_engines: Annotated[bool, typer.Option(help="Also replay on real-time simulated engines")] = True,
    calibration_repeats: Annotated[int, typer.Option(min=1, max=10, help="Calibration rounds per gateway")] = 3,
    text_probes: Annotated[int, typer.Option(
        min=0, max=4096, help="Greedy generations that measure which output token first shows text (0: none, every "
                              "first token is taken to show text; the probe is most of the profile's time)")] = 128,
    alphabet: Annotated[str, typer.Option(help="The tiny model's tokens: ascii (every token is text at once, as "
                                                "with a real vocabulary) or bytes (random bytes: many streams "
                                                "show text only at their end)")] = "ascii",
) -> None:
    """The same trace on a live tiny-model fleet, on simulated engines and in the simulator: TTFT/E2E errors."""
    import sys

    from fleetserve.bench.fidelity import FidelityConfig, run
    from fleetserve.engine.tiny import ALPHABETS

    if alphabet not in ALPHABETS:
        raise typer.BadParameter(f"{alphabet!r}; allowed values: {', '.join(ALPHABETS)}", param_hint="--alphabet")
    rate = requests / duration
    if rate > FIDELITY_MAX_RATE * replicas:  # a million requests in a second ran out of memory building the trace
        raise typer.BadParameter(f"{requests} requests in {duration:g} s is {rate:,.0f} requests/s; the tiny-model "
                                 f"fleet of {replicas} replica(s) measures at most {FIDELITY_MAX_RATE} per replica "
                                 "(more is a queue, not a latency): fewer --requests or a longer --duration",
                                 param_hint="--requests")
    cfg = FidelityConfig(requests=requests, duration_s=duration, seed=seed, replicas=replicas,
                         simulated_engines=simulated_engines, calibration_repeats=calibration_repeats,
                         text_probe=text_probes, alphabet=alphabet)
    print(json.dumps(run(cfg, progress=say if sys.stderr.isatty() else (lambda _m: None)), indent=2))
