"""`docs/metrics.md`, generated from the vocabulary: `fleetserve docs metrics -o docs/metrics.md`.

tests/observe/test_vocabulary.py fails when the committed file differs from `render_metrics_md()`.
"""

from __future__ import annotations

from pathlib import Path

from fleetserve.observe.vocabulary import DECISION_REASONS, GROUPS, LABELS, METRICS, Metric

REGENERATE = "fleetserve docs metrics -o docs/metrics.md"
DOC_PATH = Path("docs") / "metrics.md"


def _buckets(m: Metric) -> str:
    return ", ".join(f"{b:g}" for b in m.buckets) if m.buckets else ""


def _row(m: Metric) -> str:
    labels = ", ".join(m.labels) or "-"
    extra = f" Buckets: {_buckets(m)}." if m.buckets else ""
    return f"| `{m.name}` | {m.kind} | {m.unit or '-'} | {labels} | {', '.join(m.emitted_by)} | {m.help}.{extra} |"


def render_metrics_md() -> str:
    lines = [
        "# Metrics",
        "",
        f"<!-- generated from src/fleetserve/observe/vocabulary.py by `{REGENERATE}`; do not edit -->",
        "",
        "Every metric fleetserve exports, from one definition (`fleetserve.observe.vocabulary`). Counters are "
        "listed by the series name you query (`_total`); histograms add `_bucket`, `_sum` and `_count`. No "
        "`_created` series are exported. No label or value carries prompt or completion text.",
        "",
        "Where to look first: `model_latency_milliseconds`, `model_concurrent_requests`, `model_errors_total` "
        "and `model_ttfb_milliseconds`; when something is slow, the cache hit rate "
        "(`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`, `fleetserve_kv_tier_hits_total`) "
        "and `instance_type` before the replica count.",
        "",
        "The router emits the `model_*` series as HyperPod's router does only in front of vLLM and SGLang (which "
        "export none of them); in front of the built-in engine, which exports them itself, the router adds "
        "`model_invocations_total` and `model_errors_total` of the answers only it gives (`--model-metrics-scope "
        "router`), and in front of an external engine none.",
        "",
    ]
    for group, title in GROUPS.items():
        members = [m for m in METRICS if m.group == group]
        lines += [f"## {title}", "", "| name | type | unit | labels | emitted by | help |",
                  "|---|---|---|---|---|---|"]
        lines += [_row(m) for m in members]
        lines.append("")
    lines += ["## Labels", "", "Every label above, what it holds and what bounds its number of values.", "",
              "| label | values and bound |", "|---|---|"]
    lines += [f"| `{name}` | {text} |" for name, text in LABELS.items()]
    lines += ["", "`fleetserve_autoscaler_decisions_total{reason}` takes these values: "
              + ", ".join(f"`{label}`" for _, label in DECISION_REASONS) + ", `other`."]
    lines += ["", "## Logs", "",
              "The router and the engines write one line per request (`--log-format text|json`, "
              "`spec.observability.logFormat`): request id, tenant as a hash (`sha256(\"fleetserve-tenant:\" + "
              "name)`, first 12 hex digits; never the name), replica (as its model_* series and its engine's lines "
              "name it, r0 under `up`; the router adds its address as `backend`), policy and branch, status and "
              "timings; the router's line also says how many replicas it tried (`attempts`) and, for a request "
              "answered after a retry, which replicas failed it and why (`retried`, e.g. `r1:unreachable`, the "
              "reasons of `fleetserve_router_retries_total`). "
              "Prompt text only with `--log-prompts` (`spec.observability.logPrompts`), off by default. The "
              "router writes its request lines in batches every 100 ms (a line per request through `logging` "
              "cost more CPU than routing it); `fleetserve router --no-access-log` turns them off. A local fleet's log "
              "files are rotated past `spec.observability.logMaxBytes` (100 MiB by default, 0: never; "
              "`fleet/logfiles.py`: copy and truncate, `NAME.1` to `NAME.3` kept); on Kubernetes the kubelet rotates "
              "container logs.", ""]
    return "\n".join(lines)
