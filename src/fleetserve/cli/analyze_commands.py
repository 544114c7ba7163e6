"""CLI: `analyze` (prefix reuse of a trace), `profile` (measure the built-in engine) and `trace` (make and
scale workloads). Registered on the main app by `register(app)`. Bad input exits 2 naming the parameter."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from fleetserve.cli.checks import (
    MAX_THREADS,
    float_option,
    output_failed,
    reader_gone,
    writable,
    write_output,
)
from fleetserve.cli.console import err, fail
from fleetserve.input_file import not_a_file

trace_app = typer.Typer(help="Make and reshape workloads: generate, scale.", no_args_is_help=True)




def _reused(requests: list) -> bool:
    """Whether any prefix id comes back in a later request (independent prompts' ids never do)."""
    seen: set[int] = set()
    for r in requests:
        if any(h in seen for h in r.hash_ids):
            return True
        seen.update(r.hash_ids)
    return False


def _write_warnings(requests: list, output: str, fmt: str, start=None, chosen: bool = False) -> list[str]:
    """What writing `requests` to `output` as `fmt` does not say by itself: a file name of the other format, what
    an Azure CSV cannot carry (prefix ids that recur, sessions, prompt text: a simulator finds no cache hit in
    it), and the wall clock (`start`, the trace's own) that Mooncake and prompt-log files cannot."""
    from datetime import timedelta

    from fleetserve.traces.clock import CLOCKLESS_START

    out = []
    if output != "-" and (fmt == "azure") != output.lower().endswith(".csv"):  # "-": standard output, no name
        kind = "CSV" if fmt == "azure" else "JSON lines"
        out.append(f"{output} holds the {fmt} format ({kind}), which its name does not say (its readers go by "
                   "its content)" if chosen else  # --format was given: its advice was no advice
                   f"{output} gets the {fmt} format ({kind}); --format chooses another")
    if fmt != "azure" and start is not None and start != CLOCKLESS_START and requests:
        # the copy is replayed from its first request: after --rate below 1 that may be a later one than the trace's
        first = (start + timedelta(seconds=min(r.arrival_s for r in requests))).isoformat()
        out.append(f"a {fmt} file carries no wall clock: the trace's start, {start.isoformat()}, is not written, and "
                   f"simulate, verify and plan read the copy from {CLOCKLESS_START.isoformat()} (cron floors and "
                   f"budgets on another day and hour) unless given --start {first}")
    if fmt == "azure":
        lost = [what for what, has in (("prefix ids", _reused(requests)),
                                       ("sessions", any(r.session for r in requests)),
                                       ("prompt text", any(r.messages or r.prompt for r in requests))) if has]
        if lost:
            named = " and ".join([", ".join(lost[:-1]), lost[-1]] if len(lost) > 1 else lost)
            out.append(f"an Azure CSV carries times and lengths only: the {named} of the workload are not "
                       "written, so no run of this file finds a cache hit (--format mooncake keeps them)")
    return out


def _a(word: str) -> str:
    """The article and the word: "an azure", "a mooncake"."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def _choice(value: str, allowed: tuple[str, ...] | list[str], hint: str) -> str:
    if value not in allowed:
        raise typer.BadParameter(f"{value!r}; allowed values: {', '.join(allowed)}", param_hint=hint)
    return value


def analyze(
    file: Annotated[str, typer.Argument(help="Mooncake hash trace (JSONL) or prompt log (JSONL)")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON")] = False,
    model: Annotated[str | None, typer.Option(help="Tokenizer for prompt logs: builtin:NAME, hf:org/name or a path")
                     ] = None,
    replicas: Annotated[int, typer.Option(min=1, max=256, help="Replicas for the strategy comparison")] = 4,
    profile: Annotated[str, typer.Option(help="Profile preset or profile.json: engine KV capacity, KV bytes, speed")
                       ] = "h100-llama-8b",
    cache_blocks: Annotated[int | None, typer.Option(min=1, help="Engine cache per replica in the trace's blocks "
                                                                 "(default: from the profile)")] = None,
    l1_gib: Annotated[float, float_option(min=0, max=1e6, help="L1 (CPU memory) per replica, GiB")] = 32.0,
    l2_gib: Annotated[float, float_option(min=0, max=1e6, help="Shared L2 (Redis), GiB")] = 256.0,
    block_size: Annotated[int | None, typer.Option(min=1, help="Engine block size in tokens (prompt logs; 256)")
                          ] = None,
    mode: Annotated[str, typer.Option(help="What the router knows: blind (no KV events) or informed")] = "blind",
    limit: Annotated[int | None, typer.Option(min=1, help="First N requests of the file, in file order")] = None,
) -> None:
    """Measure prefix reuse in a trace: ideal and LRU hit rates, hit rate per routing strategy, and advice."""
    from fleetserve.analyze.blocks import AnalyzeInputError
    from fleetserve.analyze.report import analyze as run
    from fleetserve.analyze.report import render
    from fleetserve.analyze.routing import MODES
    from fleetserve.sim.profiles import ProfileError
    from fleetserve.traces.load import TraceError

    _choice(mode, MODES, "--mode")
    if (why := not_a_file(file)) is not None:
        raise typer.BadParameter(f"{file} {why}", param_hint="FILE")
    if block_size is not None or model is not None:  # prompt-log options: said, not ignored, on a hash trace
        from fleetserve.traces.load import detect_format

        try:
            fmt = detect_format(Path(file))
        except TraceError:
            fmt = None  # the analysis names what is wrong with the file
        if fmt in ("mooncake", "bailian"):
            hint = "--block-size" if block_size is not None else "--model"
            raise typer.BadParameter("applies to prompt logs (tokenized and cut into blocks here); a hash trace's "
                                     "blocks are its hash ids, 512 tokens each (a Bailian trace's 16-token ids are "
                                     "read as such)", param_hint=hint)
    try:
        result = run(file, model=model, replicas=replicas, profile=profile, cache_blocks=cache_blocks, l1_gib=l1_gib,
                     l2_gib=l2_gib, block_tokens=block_size or 256, mode=mode, limit=limit)
    except ProfileError as exc:
        raise fail(f"--profile: {exc}") from None
    except (AnalyzeInputError, TraceError) as exc:
        raise fail(str(exc), fallback="FILE") from None
    for warning in result["warnings"]:
        err.print(f"warning: {warning}", markup=False)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    for line in render(result):
        print(line)


def profile(
    model: Annotated[str, typer.Option(help="Model source: builtin:NAME, hf:org/name, a path, catalog:NAME")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON")] = False,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Write the profile file here")] = None,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16 or float16")] = "auto",
    threads: Annotated[int | None, typer.Option(min=1, max=MAX_THREADS, help="torch threads (default: torch's)")
                       ] = None,
    max_prompt: Annotated[int, typer.Option(min=64, help="Longest prompt measured (tokens; at least two lengths "
                                                         "of 32, 64, 128, ...)")] = 2048,
    batches: Annotated[str, typer.Option(help="Decode batch sizes, comma-separated")] = "1,2,4,8",
    repeats: Annotated[int, typer.Option(min=1, max=50, help="Runs per figure (the fastest counts)")] = 3,
    cache_bytes: Annotated[int, typer.Option(min=1, help="Engine KV cache bytes (the engine's default)")
                           ] = 512 << 20,
    block_size: Annotated[int, typer.Option(min=1, help="KV block size in tokens")] = 256,
    max_batch: Annotated[int, typer.Option(min=1, max=256, help="The engine's batch limit the simulator uses "
                                                                 "(`fleetserve engine --max-batch`)")] = 8,
) -> None:
    """Measure the built-in engine here (prefill, decode steps, KV bytes, load time) as a simulator profile."""
    from fleetserve.analyze.measure import PROMPT_LENGTHS, MeasureInputError, measure
    from fleetserve.engine.demo import ModelSourceError

    _choice(dtype, ("auto", "float32", "bfloat16", "float16"), "--dtype")
    try:
        sizes = tuple(sorted({int(b) for b in batches.split(",")}))  # an empty item is an error, not skipped
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1 or max(sizes) > 256:
        raise typer.BadParameter(f"{batches!r}; allowed values: comma-separated integers 1..256",
                                 param_hint="--batches")
    if output and Path(output).is_dir():  # found after minutes of measuring, as a traceback
        raise typer.BadParameter(f"{output} is a folder; give a file name (profile.json)", param_hint="--output")
    folder = Path(model).expanduser()
    if output and folder.is_dir() and Path(output).resolve().is_relative_to(folder.resolve()):
        # `-o MODEL/config.json` replaced the model's own config: the next profile of it was a traceback
        raise typer.BadParameter(f"{output} is inside the model folder {model}; write the profile elsewhere",
                                 param_hint="--output")
    writable(output, "--output", (model,))  # a read-only file had been overwritten (root may write anyway)
    progress = None if as_json or not sys.stderr.isatty() else (lambda m: err.print(m, markup=False))
    try:
        result = measure(model, dtype=dtype, threads=threads, max_prompt=max_prompt, batches=sizes, repeats=repeats,
                         cache_bytes=cache_bytes, block_size=block_size, max_batch=max_batch, progress=progress)
    except ModelSourceError as exc:
        raise fail(f"--model: {exc}") from None
    except MeasureInputError as exc:
        raise typer.BadParameter(str(exc), param_hint=exc.option) from None
    longest = max(p["tokens"] for p in result["measurements"]["prefill"])
    grid = max((n for n in PROMPT_LENGTHS if n <= max_prompt), default=longest)
    if longest < grid:  # the model's context capped it: prompts are measured up to half of it
        err.print(f"warning: prompts measured up to {longest} tokens, not --max-prompt {max_prompt}: the model's "
                  f"context is {result['context_length']} tokens (prefill is measured up to half of it)",
                  markup=False)
    for warning in result["warnings"]:
        err.print(f"warning: {warning}", markup=False)
    unwritten = write_output(output, json.dumps(result, indent=2) + "\n", "--output") if output else None
    if as_json:
        print(json.dumps(result, indent=2))
        if unwritten:
            raise output_failed(unwritten)
        return
    print(f"{result['model']} ({result['dtype']}) on {result['device']['cpu']}: load {result['load_s']}s, "
          f"KV {result['kv_bytes_per_token']} bytes/token")
    print("prefill tokens/s by prompt length: " + ", ".join(f"{k}: {v:,.0f}"
                                                          for k, v in result["prefill_tokens_per_s"].items()))
    print("decode step: " + ", ".join(f"b{d['batch']}/ctx{d['context']}: {d['step_s'] * 1000:.1f} ms"
                                      for d in result["measurements"]["decode"]))
    if unwritten:
        raise output_failed(unwritten)
    if output:
        print(f"profile written to {output}")


@trace_app.command("generate")
def trace_generate(
    kind: Annotated[str, typer.Argument(help="diurnal, bursts, chat, system-prompt or rag")],
    output: Annotated[str, typer.Option("--output", "-o", help="File to write")],
    fmt: Annotated[str | None, typer.Option("--format", help="mooncake (hash ids; the default), prompts (prompt "
                                                             "log) or azure")] = None,
    duration: Annotated[float, float_option(min=1, help="Seconds of traffic")] = 600.0,
    rate: Annotated[float, float_option(min=0.001, help="Mean requests per second (diurnal: over the whole "
                                                         "--period; a shorter trace gets the part of the day it "
                                                         "covers, from 10:00 UTC, where the simulator starts "
                                                         "it)")] = 2.0,
    seed: Annotated[int, typer.Option(min=0, help="Same seed, same workload")] = 0,
    arrivals: Annotated[str | None, typer.Option(help="Override the arrival process: poisson, diurnal, bursts")
                        ] = None,
    input_tokens: Annotated[int | None, typer.Option(min=1, help="Mean new prompt tokens per request")] = None,
    output_tokens: Annotated[int | None, typer.Option(min=1, help="Mean output tokens")] = None,
    turns: Annotated[float | None, float_option(min=1, help="chat: mean turns per session")] = None,
    think: Annotated[float | None, float_option(min=0, help="chat: mean seconds between turns")] = None,
    system_prompts: Annotated[int | None, typer.Option(min=1, help="system-prompt: distinct system prompts")] = None,
    system_tokens: Annotated[int | None, typer.Option(min=1, help="chat, system-prompt: system prompt tokens")
                             ] = None,
    documents: Annotated[int | None, typer.Option(min=1, help="rag: documents in the corpus")] = None,
    doc_tokens: Annotated[int | None, typer.Option(min=1, help="rag: tokens per document")] = None,
    docs_per_request: Annotated[int | None, typer.Option(min=1, help="rag: documents per prompt")] = None,
    period: Annotated[float | None, float_option(min=1, help="diurnal: period in seconds (86400); each peaks 4/24 of "
                                                             "the way through: 14:00 of a day that starts at 10:00 "
                                                             "UTC, where the simulator starts it")] = None,
    peak_to_trough: Annotated[float | None, float_option(min=1, help="diurnal: peak rate / trough rate")] = None,
    burst_factor: Annotated[float | None, float_option(min=1, help="bursts: rate multiplier in a burst")] = None,
    burst_every: Annotated[float | None, float_option(min=1, help="bursts: mean seconds between bursts")] = None,
    burst_length: Annotated[float | None, float_option(min=0.1, help="bursts: seconds a burst lasts")] = None,
) -> None:
    """Write a generated workload (deterministic by seed) as a Mooncake hash trace, prompt log or Azure CSV."""
    from fleetserve.traces.arrivals import ARRIVALS
    from fleetserve.traces.generate import KINDS, WorkloadSpec, generate
    from fleetserve.traces.write import WRITE_FORMATS, write_trace

    _choice(kind, tuple(KINDS), "KIND")
    chosen, fmt = fmt is not None, fmt or "mooncake"
    _choice(fmt, WRITE_FORMATS, "--format")
    if arrivals is not None:
        _choice(arrivals, ARRIVALS, "--arrivals")
    writable(output, "--output")
    process, content = KINDS[kind]
    process = arrivals or process
    knobs = {"--turns": (turns, "chat"), "--think": (think, "chat"),
             "--system-prompts": (system_prompts, "system-prompt"),
             "--system-tokens": (system_tokens, "chat or system-prompt"), "--documents": (documents, "rag"),
             "--doc-tokens": (doc_tokens, "rag"), "--docs-per-request": (docs_per_request, "rag"),
             "--period": (period, "diurnal"), "--peak-to-trough": (peak_to_trough, "diurnal"),
             "--burst-factor": (burst_factor, "bursts"), "--burst-every": (burst_every, "bursts"),
             "--burst-length": (burst_length, "bursts")}
    for flag, (value, applies) in knobs.items():  # said, not ignored: rag --burst-factor 5 was Poisson still
        if value is not None and content not in applies.split(" or ") and process not in applies.split(" or "):
            what = "arrivals" if applies in ("diurnal", "bursts") else "workloads"
            raise typer.BadParameter(f"applies to {applies} {what}; {kind} has {content} prompts and {process} "
                                     "arrivals" + (" (--arrivals chooses them)" if what == "arrivals" else ""),
                                     param_hint=flag)
    spec = WorkloadSpec.for_kind(
        kind, arrivals=arrivals, duration_s=duration, rate=rate, seed=seed, input_tokens=input_tokens,
        output_tokens=output_tokens, turns=turns, think_s=think, system_prompts=system_prompts,
        system_tokens=system_tokens, documents=documents, doc_tokens=doc_tokens, docs_per_request=docs_per_request,
        period_s=period, peak_to_trough=peak_to_trough, burst_factor=burst_factor, burst_every_s=burst_every,
        burst_s=burst_length)
    if docs_per_request is not None and spec.docs_per_request > spec.documents:  # drawn as --documents, silently
        raise typer.BadParameter(f"{spec.docs_per_request} is more than the {spec.documents} documents of the corpus "
                                 "(--documents)", param_hint="--docs-per-request")
    try:
        requests = generate(spec, with_text=fmt == "prompts")
    except ValueError as exc:  # a knob past its bound, or too much to build (the bounds name the duration and rate)
        raise typer.BadParameter(str(exc), param_hint=getattr(exc, "option", "--duration/--rate")) from None
    if not requests:
        raise fail("the workload has no requests: raise --rate or --duration")
    from fleetserve.traces.load import MAX_TOKENS

    longest = max(max(r.input_tokens, r.output_tokens) for r in requests)
    if longest > MAX_TOKENS:  # the loader would refuse the file it wrote
        raise fail(f"the workload has requests of {longest} tokens, over the trace limit of {MAX_TOKENS} per "
                    "request (chat prompts grow with every turn): lower --input-tokens, --output-tokens, "
                    "--system-tokens, --doc-tokens or --turns")
    from fleetserve.traces.clock import CLOCKLESS_START

    for warning in _write_warnings(requests, output, fmt, chosen=chosen):
        err.print(f"warning: {warning}", markup=False)
    try:
        write_trace(requests, output, fmt, start=CLOCKLESS_START)  # the workload's own clock, in every format
    except BrokenPipeError:
        raise reader_gone() from None
    except OSError as exc:  # a full disk (/dev/full) had been a traceback
        raise fail(f"--output: cannot write {output}: {exc.strerror or exc}") from None
    err.print(f"{len(requests)} requests over {duration:g}s ({len(requests) / duration:.3g}/s; {spec.arrivals} "
              f"arrivals, {spec.content} prompts) written to {_named(output)} ({fmt})", markup=False)


def _named(output: str) -> str:
    from fleetserve.traces.write import STDOUT

    return "standard output" if output == STDOUT else output


@trace_app.command("scale")
def trace_scale(
    file: Annotated[str, typer.Argument(help="Trace: Mooncake JSONL, Azure CSV, prompt log or ServeGen rate file")],
    output: Annotated[str, typer.Option("--output", "-o", help="File to write")],
    rate: Annotated[float | None, float_option(min=0.0001, help="Multiply the request rate (same span)")] = None,
    time_scale: Annotated[float | None, float_option("--time", min=0.0001, help="Multiply arrival times")] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="mooncake, prompts or azure (default: as read)")
                   ] = None,
    seed: Annotated[int, typer.Option(min=0, help="Seed for rate scaling")] = 0,
    limit: Annotated[int | None, typer.Option(min=1, help="First N requests of the file, in file order (a "
                                                          "ServeGen file: the first N arrivals drawn at its rates "
                                                          "times --rate)")] = None,
    model: Annotated[str | None, typer.Option(help="ServeGen: the model folder or name")] = None,
    duration: Annotated[float | None, float_option(min=1, help="ServeGen: seconds of the rate file to read")] = None,
) -> None:
    """Rate scaling (more requests over the same span) and/or time scaling (stretch or compress the clock)."""
    from fleetserve.traces.load import TraceError, detect_format, read_trace
    from fleetserve.traces.scale import scale_rate, scale_time
    from fleetserve.traces.write import WRITE_FORMATS, write_trace

    if fmt is not None:
        _choice(fmt, WRITE_FORMATS, "--format")
    if rate is None and time_scale is None and fmt is None and model is None:  # --format (or a ServeGen --model)
        # alone converts, at the trace's own pace
        raise typer.BadParameter("give --rate and/or --time (or --format to convert, or --model to write one "
                                 "ServeGen model's arrivals)", param_hint="--rate/--time")
    writable(output, "--output", (file,))
    path = Path(file)
    if not path.exists():
        raise typer.BadParameter(f"{file} does not exist", param_hint="FILE")
    options = {k: v for k, v in {"model": model, "duration_s": duration}.items() if v is not None}
    flags = {"model": "--model", "duration_s": "--duration", "rate_scale": "--rate"}
    try:
        found = detect_format(path)
    except TraceError as exc:  # an empty or unreadable file: its own error (it was a traceback here)
        raise fail(str(exc), fallback="FILE") from None
    if options and found != "servegen":  # said in the command line's words
        raise typer.BadParameter(f"applies to ServeGen rate files only; {file} is {_a(found)} trace",
                                 param_hint="/".join(flags[k] for k in options))
    scaled = rate
    if found == "servegen":  # its arrivals are drawn with --seed, at its rates scaled first (thinning 237 million
        options["seed"] = seed  # of them afterwards was refused for their number)
        if rate is not None:
            options["rate_scale"], rate = rate, None
    try:
        requests, start, notes = read_trace(path, limit, **options)
    except TraceError as exc:
        if exc.param in flags:
            raise typer.BadParameter(str(exc), param_hint=flags[exc.param]) from None
        raise fail(str(exc), fallback="FILE") from None
    if rate is not None:
        try:
            requests = scale_rate(requests, rate, seed=seed)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--rate") from None
    if time_scale is not None:
        try:
            requests = scale_time(requests, time_scale)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--time") from None
    if not requests:
        raise typer.BadParameter(f"{scaled:g} leaves none of the trace's requests; use a larger factor",
                                 param_hint="--rate")
    chosen = fmt is not None
    if fmt is None:
        src = detect_format(path)
        # ServeGen rates are not written back: the output's name picks Azure CSV or Mooncake JSONL
        fmt = src if src in WRITE_FORMATS else "azure" if output.lower().endswith(".csv") else "mooncake"
    warnings = [*notes, *_write_warnings(requests, output, fmt, start, chosen)]
    if start is None:  # a trace without a wall clock is simulated from the default start: stamp it from there, so
        from fleetserve.traces.clock import CLOCKLESS_START  # that verify and plan read the converted file as

        start = CLOCKLESS_START  # they read the original
    try:
        write_trace(requests, output, fmt, start=start)
    except ValueError as exc:  # before the warnings about the file: none was written (they came first, then this)
        raise fail(f"--format: {exc}") from None
    except BrokenPipeError:
        raise reader_gone() from None
    except OSError as exc:
        raise fail(f"--output: cannot write {output}: {exc.strerror or exc}") from None
    for warning in warnings:
        err.print(f"warning: {warning}", markup=False)
    if detect_format(path) == "servegen":
        from fleetserve.traces.servegen import size_warning

        err.print(f"warning: {size_warning()}; {output} carries these sizes as if measured, and runs on it "
                  "cannot tell", markup=False)
    err.print(f"{len(requests)} requests written to {_named(output)} ({fmt})", markup=False)


def register(app: typer.Typer) -> None:
    app.command()(analyze)
    app.command()(profile)
    app.add_typer(trace_app, name="trace")
