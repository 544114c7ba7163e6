"""The fleet's own Prometheus: configuration, rules and the targets it follows as replicas come and go.

`fleetserve up` (with `spec.observability.prometheus` on: the default where the `prometheus` binary is
installed) writes into the fleet's run folder:

    prometheus/prometheus.yml      three scrape jobs (engine, router, supervisor) and the rule file
    prometheus/rules.yml           observe/rules.py's records and alerts for this endpoint
    prometheus/targets/*.json      file-based service discovery: one file per job
    prometheus/data/               the TSDB (retention: `observability.prometheus.retention`)

and runs `prometheus` as a supervised child (restarted with the same back-off as Redis), on loopback with basic
auth (`prometheus/web.yml`: user `fleetserve`, its password in the run folder's `prometheus.password`, 0600): its
series name the tenants, which the router's own /metrics shows only to the admin and internal tokens. The supervisor
rewrites `targets/engine.json` whenever the set of replicas that may serve changes (Prometheus picks a
changed file up by inotify, within seconds); a file is replaced atomically (write + rename), so Prometheus
never reads half a list. Engines' and the router's /metrics need the fleet's internal token: Prometheus
sends it as a bearer token read from `internal.token` (`credentials_file`), never from its configuration.

Labels: every target carries `fleet` and `component` (engine, router, supervisor); engine targets also
`replica` and `instance_type`, equal to the ones the engines put on their `model_*` series
(`honor_labels: true` keeps the exporter's labels as they are).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from fleetserve.fleet.process import Child
from fleetserve.observe.rules import RuleTarget, rule_groups
from fleetserve.whole_file import write_whole

JOBS = ("engine", "router", "supervisor")


def binary() -> str | None:
    return shutil.which("prometheus")


def wanted(spec) -> bool:
    """On when the spec says so; by default on where the prometheus binary exists."""
    enabled = spec.observability.prometheus.enabled
    return binary() is not None if enabled is None else enabled


@dataclass(frozen=True)
class Target:
    url: str  # http(s)://host:port[/metrics]
    component: str
    replica: str = ""
    instance_type: str = ""

    def group(self, fleet: str, namespace: str = "") -> dict:
        """The target and its labels; `namespace` as Kubernetes' targets carry it, so the dashboard's namespace
        filter keeps the series that name no model (KV tiers, the router's) on a local fleet too."""
        labels = {"fleet": fleet, "component": self.component}
        if namespace:
            labels["namespace"] = namespace
        if self.replica:
            labels["replica"] = self.replica
        if self.instance_type:
            labels["instance_type"] = self.instance_type
        return {"targets": [urlsplit(self.url).netloc], "labels": labels}


def targets_file(folder: Path, job: str) -> Path:
    return folder / "targets" / f"{job}.json"


def write_targets(folder: Path, job: str, fleet: str, targets: list[Target], namespace: str = "") -> None:
    """Replace a job's target list atomically (Prometheus reads the file on change)."""
    write_whole(targets_file(folder, job), lambda f: json.dump([t.group(fleet, namespace) for t in targets], f,
                                                               indent=1))  # no cut-off temporary left on a full disk


def read_targets(folder: Path, job: str) -> list[dict]:
    try:
        return json.loads(targets_file(folder, job).read_text())
    except (OSError, json.JSONDecodeError):
        return []


def rule_target(endpoint, fleet: str) -> RuleTarget:
    """The rules for a local fleet: router and supervisor series are found by the labels of their targets."""
    sup = f'fleet="{fleet}",component="supervisor"'
    return RuleTarget.from_endpoint(
        endpoint, f"fleetserve.{endpoint.metadata.namespace}.{fleet}", f'fleet="{fleet}",component="router"',
        engines=f'fleet="{fleet}",component="engine"',
        desired=f"max(fleetserve_autoscaler_desired_replicas{{{sup}}})",
        ready=f"max(fleetserve_autoscaler_ready_replicas{{{sup}}})",
        cost_per_hour=f"max(fleetserve_cost_per_hour_dollars{{{sup}}})")


def config(folder: Path, *, scrape_interval_s: int, token_file: Path, router_scheme: str = "http",
           router_ca: str = "") -> dict:
    """prometheus.yml: one job per component, each following its targets file."""
    interval = f"{scrape_interval_s}s"

    def job(name: str, auth: bool, scheme: str = "http", ca: str = "") -> dict:
        out: dict = {"job_name": f"fleetserve-{name}", "honor_labels": True, "scheme": scheme,
                     "metrics_path": "/metrics",
                     "file_sd_configs": [{"files": [str(targets_file(folder, name))], "refresh_interval": "30s"}]}
        if auth:
            out["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
        if ca:
            out["tls_config"] = {"ca_file": ca}
        return out

    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "scrape_timeout": f"{min(scrape_interval_s, 10)}s"},
        "rule_files": [str(folder / "rules.yml")],
        "scrape_configs": [job("engine", True), job("router", True, router_scheme, router_ca),
                           job("supervisor", False)],
    }


def write_files(folder: Path, endpoint, fleet: str, *, scrape_interval_s: int, token_file: Path,
                router_scheme: str = "http", router_ca: str = "") -> Path:
    """Write prometheus.yml and rules.yml (and empty target lists); returns the configuration's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rules.yml").write_text(yaml.safe_dump({"groups": rule_groups(rule_target(endpoint, fleet))},
                                                     sort_keys=False, width=1000))
    for name in JOBS:
        if not targets_file(folder, name).exists():
            write_targets(folder, name, fleet, [])
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(config(folder, scrape_interval_s=scrape_interval_s, token_file=token_file,
                                          router_scheme=router_scheme, router_ca=router_ca), sort_keys=False))
    return path


USER = "fleetserve"  # the one user of the fleet's Prometheus; its password lies in PASSWORD_FILE (0600)
PASSWORD_FILE = "prometheus.password"


def kept_password(path: Path) -> str | None:
    """The password of the fleet's last run, when its file is still ours alone (0600, this user): a Grafana data
    source given it keeps working across `down` and `up` (each start had made a new one)."""
    try:
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        password = path.read_text().strip()
    except OSError:
        return None
    return password if len(password) >= 32 else None


def write_web_config(folder: Path, password: str) -> Path:
    """Prometheus' web configuration: basic auth for every path. Its series name the tenants (the router's own
    /metrics answers only the admin and the internal token), and loopback is open to every local process."""
    import bcrypt

    path = folder / "web.yml"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()
    path.write_text(yaml.safe_dump({"basic_auth_users": {USER: hashed}}))
    os.chmod(path, 0o600)
    return path


def with_credentials(url: str, password: str) -> str:
    """The URL with the user and password in it (httpx sends them as basic auth); never written to state."""
    parts = urlsplit(url)
    return parts._replace(netloc=f"{USER}:{password}@{parts.netloc}").geturl()


def child(folder: Path, port: int, retention: str, log_path: Path, log_format: str = "text",
          env_drop: frozenset[str] = frozenset()) -> Child:
    """The Prometheus process: loopback only, basic auth (web.yml), its TSDB in the fleet's folder; its log in the
    fleet's format (logFormat json had left prometheus.log in logfmt beside the other JSON logs)."""
    cmd = [binary() or "prometheus", f"--config.file={folder / 'prometheus.yml'}",
           f"--storage.tsdb.path={folder / 'data'}", f"--storage.tsdb.retention.time={retention}",
           f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={folder / 'web.yml'}",
           f"--log.format={'json' if log_format == 'json' else 'logfmt'}",
           # a restarted Prometheus restores its alerts' `for` state from its TSDB only for a `for` longer than
           # this grace (10m by default, longer than every alert of ours): a cost alert firing before a crash had
           # read as resolved after it, and was silent for its whole `for` again
           "--rules.alert.for-grace-period=0s"]
    return Child("prometheus", cmd, log_path, env_drop=env_drop)  # without the fleet's plaintext API keys
