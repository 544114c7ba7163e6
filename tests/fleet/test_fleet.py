"""`fleetserve up/status/down` with real child processes; nothing may be left behind in any path."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from tests.helpers import fleet_status, fleetserve, processes_with_env, wait_until

SPEC = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {{name: {name}}}
spec:
  model: {{name: tiny, source: "{source}"}}
  engine: {{kind: builtin, threads: 1, startupTimeoutSeconds: 120{extra_engine}}}
  replicas: {replicas}
  routing: {{strategy: roundrobin}}
"""


def write_spec(tmp_path, source, name="t", replicas=2, extra_engine=""):
    path = tmp_path / f"{name}.yaml"
    path.write_text(SPEC.format(name=name, source=source, replicas=replicas, extra_engine=extra_engine))
    return str(path)


def status(home, name=None):
    result = fleetserve("status", *([name] if name else []), "--json", env=home, check=True)
    return json.loads(result.stdout)


def leftovers(home):
    return processes_with_env("FLEETSERVE_HOME", home["FLEETSERVE_HOME"])


def forked(pid: int) -> bool:
    """Whether `pid` was forked from an engine fork server (fleet/forkserver.py): it keeps the server's first
    environment, which names setproctitle's SPT_NOENV (an engine started as a new interpreter has its own)."""
    return b"SPT_NOENV=1" in Path(f"/proc/{pid}/environ").read_bytes()


def test_up_detach_serves_restarts_crashed_replica_and_down_cleans_up(tmp_path, tiny_model, home):
    spec = write_spec(tmp_path, tiny_model)
    up = fleetserve("up", spec, "--detach", env=home)
    assert up.returncode == 0, up.stderr
    assert "endpoint: http://127.0.0.1:" in up.stdout and "model: tiny" in up.stdout
    (state,) = status(home)
    assert state["status"] == "ready" and [r["state"] for r in state["replicas"]] == ["ready", "ready"]
    client = openai.OpenAI(base_url=state["url"], api_key="x", max_retries=0)
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=5)
    assert reply.usage.completion_tokens <= 5

    victim = state["replicas"][0]
    assert forked(victim["pid"])  # from the fleet's engine fork server: no interpreter start, no torch import
    os.kill(victim["pid"], signal.SIGKILL)
    for _ in range(5):  # the router keeps answering while the replica is down
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)

    def restarted():
        r = fleet_status(home)[0]["replicas"][0]
        return r["restarts"] >= 1 and r["state"] == "ready"

    wait_until(restarted, 120, interval=0.5, what="crashed replica restarted")
    assert status(home)[0]["replicas"][0]["last_exit"] == -signal.SIGKILL
    assert forked(status(home)[0]["replicas"][0]["pid"])  # the restart too

    again = fleetserve("up", spec, "--detach", env=home)
    assert again.returncode == 1 and "already running" in again.stderr

    # a router that cannot come back (its port taken meanwhile) is named, not hidden behind "ready"
    state = status(home)[0]
    assert state["router_status"] == "up" and not state["serving"]
    port = int(state["url"].rsplit(":", 1)[1].split("/")[0])
    os.kill(state["router_pid"], signal.SIGKILL)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        wait_until(lambda: _bound(squatter, port), 10, interval=0.05, what="the router's port taken")
        squatter.listen()
        now: dict = {}

        def failed_restart() -> bool:
            now.update(status(home)[0])  # one snapshot: the next restart may begin between two reads
            return "restarting (exit code 2" in now["router_status"]  # the port refused, named

        wait_until(failed_restart, 60, interval=0.3, what="the router's failed restart reported")
        assert now["serving"].startswith("router restarting (exit code") and "nothing is served" in now["serving"]
        assert "in use" in now["router_status"], now["router_status"]
    wait_until(lambda: fleet_status(home)[0]["router_status"] == "up", 60, interval=0.3, what="the router back")
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)

    down = fleetserve("down", env=home)
    assert down.returncode == 0, down.stderr
    assert leftovers(home) == []
    # a stopped fleet is listed by name or with --all, not among the running ones; --prune removes what is kept
    (name,) = [f["name"] for f in json.loads(fleetserve("status", "--all", "--json", env=home, check=True).stdout)]
    assert status(home) == [] and status(home, name)[0]["status"] == "stopped"
    assert "1 stopped fleet(s) not shown" in fleetserve("status", env=home, check=True).stdout
    pruned = fleetserve("status", "--prune", env=home, check=True).stdout
    assert f"removed 1 fleet(s): {name}" in pruned
    gone = fleetserve("status", name, env=home)  # a name no fleet has: bad input, exit 2 (it was 1)
    assert gone.returncode == 2 and f"no fleet named {name!r}" in gone.stderr
    assert fleetserve("down", name, env=home).returncode == 2
    assert fleetserve("status", "--interval", "5", env=home).returncode == 2  # redraws only with --watch


def test_ctrl_c_while_a_detached_fleet_starts_stops_it_and_the_next_start_keeps_its_logs(tmp_path, tiny_model, home):
    """Ctrl-C during `up --detach` exited 130 in silence while the supervisor, in a session of its own, went on
    starting: a fleet ready later whose URL was never printed. A start deleted the last run's logs (a crashed
    run's evidence), and picked a new port: every start gave clients a new URL."""
    from pathlib import Path

    spec = write_spec(tmp_path, tiny_model, name="cc", replicas=1)
    # a shell that started this suite in the background ignores SIGINT, and children inherit that: as at a terminal
    cli = subprocess.Popen([sys.executable, "-m", "fleetserve", "up", spec, "--detach"], env={**os.environ, **home},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    folder = Path(home["FLEETSERVE_HOME"]) / "run" / "cc"
    try:
        wait_until(lambda: (folder / "state.json").exists(), 60, what="the supervisor started")
        cli.send_signal(signal.SIGINT)
        _, stderr = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode != 0 and "start of fleet cc interrupted: it was stopped" in stderr, stderr
    assert leftovers(home) == [] and status(home, "cc")[0]["status"] == "stopped"
    first_run = (folder / "supervisor.log").read_text()
    assert first_run
    import re  # every line with its time, as the router's and engines' have it (they had none)

    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} supervisor (INFO|WARNING|ERROR) ", line)
               for line in first_run.splitlines()), first_run
    again = fleetserve("up", spec, "--detach", env=home)
    assert again.returncode == 0, again.stderr
    try:
        assert (folder / "logs.previous" / "supervisor.log").read_text() == first_run  # kept, not deleted
        url = status(home, "cc")[0]["url"]
    finally:
        assert fleetserve("down", "cc", env=home).returncode == 0
    # started again, the fleet keeps the URL its clients were given (every start picked a new port)
    third = fleetserve("up", spec, "--detach", env=home)
    try:
        assert third.returncode == 0 and status(home, "cc")[0]["url"] == url, third.stderr
    finally:
        assert fleetserve("down", "cc", env=home).returncode == 0
    assert leftovers(home) == []
    pruned = fleetserve("status", "--prune", "--json", env=home, check=True)  # it printed a sentence
    assert json.loads(pruned.stdout) == {"removed": ["cc"], "kept": []}


def test_a_start_that_failed_keeps_the_last_runs_url_and_logs(tmp_path, tiny_model, home):
    """One failed `up` between two good ones gave the next start a new URL (it read the failed start's state, which
    had none) and pushed the last run's logs away for the failed attempt's."""
    from pathlib import Path

    spec = write_spec(tmp_path, tiny_model, name="keep", replicas=1)
    folder = Path(home["FLEETSERVE_HOME"]) / "run" / "keep"
    assert fleetserve("up", spec, "--detach", env=home).returncode == 0
    url = status(home, "keep")[0]["url"]
    assert fleetserve("down", "keep", env=home).returncode == 0
    good_run = (folder / "supervisor.log").read_text()
    (tmp_path / "bad").mkdir()
    bad = write_spec(tmp_path / "bad", tmp_path / "no-such-model", name="keep", replicas=1)
    failed = fleetserve("up", bad, "--detach", env=home)
    assert failed.returncode == 2 and "spec.model.source" in failed.stderr, failed.stderr
    assert status(home, "keep")[0]["status"] == "failed"  # shown, with its error, until the next start
    again = fleetserve("up", spec, "--detach", env=home)
    try:
        assert again.returncode == 0, again.stderr
        assert status(home, "keep")[0]["url"] == url
        assert (folder / "logs.previous" / "supervisor.log").read_text() == good_run
        assert "spec.model.source" in (folder / "logs.failed-start" / "supervisor.log").read_text()
    finally:
        assert fleetserve("down", "keep", env=home).returncode == 0
    assert leftovers(home) == []


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 130)])
def test_sigterm_or_a_closed_terminal_while_a_detached_fleet_starts_stops_it(tmp_path, tiny_model, home, sig, code):
    """Only Ctrl-C stopped the start: SIGTERM and SIGHUP (a closed terminal) took Python's default exit and left
    the fleet starting, ready later, with nothing printed."""
    from pathlib import Path

    spec = write_spec(tmp_path, tiny_model, name="hup", replicas=1)
    # a shell that started this suite in the background ignores SIGINT, and children inherit that: as at a terminal
    cli = subprocess.Popen([sys.executable, "-m", "fleetserve", "up", spec, "--detach"], env={**os.environ, **home},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: (Path(home["FLEETSERVE_HOME"]) / "run" / "hup" / "state.json").exists(), 60,
                   what="the supervisor started")
        cli.send_signal(sig)
        _, stderr = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == code and "start of fleet hup interrupted: it was stopped" in stderr, (cli.returncode,
                                                                                                   stderr)
    assert leftovers(home) == [] and status(home, "hup")[0]["status"] == "stopped"


def _bound(sock, port) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("field,section", [
    ("spec.router.port", "router: {{port: {port}}}"),
    ("spec.observability.prometheus.port", "observability: {{prometheus: {{port: {port}}}}}")])
def test_a_port_in_use_fails_the_start_naming_the_field(tmp_path, tiny_model, home, field, section):
    """Another fleet's router on the port answered the readiness check: the second fleet read "ready" with the
    first one's endpoint, its own router restarting in a loop behind it. A Prometheus port in use failed the
    start with Prometheus's own log lines, after the model was prepared."""
    if "prometheus" in field and shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus is not installed: the fleet starts none")
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        path = write_spec(tmp_path, tiny_model, name="busy", replicas=1)
        with open(path, "a") as f:
            f.write("  " + section.format(port=port) + "\n")
        up = fleetserve("up", path, "--detach", env=home)
    assert up.returncode == 2  # the spec's field to change, as `router --port` on a taken port (it was 1)
    assert f"{field}: port {port} on 127.0.0.1 is already in use" in up.stderr, up.stderr
    assert "Traceback" not in up.stderr
    assert leftovers(home) == []


@pytest.mark.parametrize("section, said", [
    ("tls: {{enabled: true, certFile: {missing}.pem, keyFile: {missing}.key}}",
     "spec.tls.certFile {missing}.pem: no such file"),
    ("router: {{host: 'not a host!'}}", "spec.router.host"),
])
def test_what_the_spec_names_and_this_machine_lacks_is_bad_input_before_the_model(tmp_path, tiny_model, home,
                                                                                    section, said):
    """A TLS certificate that is not there was a traceback (FileNotFoundError) after the model was prepared, exit
    1; a router host that is no address here was exit 1 too. Both are the spec's: exit 2, naming the field."""
    missing = tmp_path / "nowhere"
    path = write_spec(tmp_path, tiny_model, name="lacks", replicas=1)
    with open(path, "a") as f:
        f.write("  " + section.format(missing=missing) + "\n")
    up = fleetserve("up", path, "--detach", env=home)
    assert up.returncode == 2 and said.format(missing=missing) in up.stderr, up.stderr
    assert "Traceback" not in up.stderr and leftovers(home) == []


def test_a_replica_slower_than_its_startup_timeout_names_the_setting(tmp_path, tiny_model, home):
    """"did not become ready in time during start-up; last log lines (...):" and nothing after it, or "model
    preparation ... timed out": which time?"""
    path = tmp_path / "slow.yaml"
    path.write_text(SPEC.format(name="slow", source=tiny_model, replicas=1, extra_engine="").replace(
        "startupTimeoutSeconds: 120", "startupTimeoutSeconds: 0.2"))
    up = fleetserve("up", str(path), "--detach", env=home)
    assert up.returncode == 1, up.stderr
    # the model's preparation (a local folder: checked, not copied) or the replica's start, whichever ran out
    assert "within spec.engine.startupTimeoutSeconds (0.2s)" in up.stderr, up.stderr
    assert leftovers(home) == []


def test_failed_start_reports_the_cause_and_leaves_nothing(tmp_path, home):
    spec = write_spec(tmp_path, tmp_path / "no-such-model", name="broken")
    up = fleetserve("up", spec, "--detach", env=home)
    assert up.returncode == 2  # bad input: the spec names a model that is not there (it was 1)
    assert "spec.model.source" in up.stderr and "no-such-model" in up.stderr and "does not exist" in up.stderr
    foreground = fleetserve("up", spec, env=home)
    assert foreground.returncode == 2 and "spec.model.source" in foreground.stderr + foreground.stdout
    assert leftovers(home) == []
    assert status(home)[0]["status"] == "failed"


def test_replica_crashing_at_start_fails_the_fleet_with_its_log(tmp_path, tiny_model, home):
    # a value the engine refuses at its start (a flag it lacks is refused before anything starts)
    spec = write_spec(tmp_path, tiny_model, name="crash", extra_engine=', args: ["--max-batch", "0"]')
    up = fleetserve("up", spec, "--detach", env=home)
    assert up.returncode == 1
    assert "exited with code" in up.stderr and "max-batch" in up.stderr, up.stderr
    assert leftovers(home) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_foreground_up_stops_everything_on_sigterm(tmp_path, tiny_model, home, sig):
    """SIGHUP too (the terminal closed): it had killed the supervisor at once, its requests in flight cut."""
    spec = write_spec(tmp_path, tiny_model, name="fg", replicas=1)
    proc = subprocess.Popen([sys.executable, "-m", "fleetserve", "up", spec], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **home})
    try:
        for line in proc.stdout:
            if line.startswith("endpoint:"):
                break
        assert status(home, "fg")[0]["status"] == "ready"
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        assert leftovers(home) == []
        assert status(home, "fg")[0]["status"] == "stopped"
        said = proc.stderr.read()  # it said nothing between the signal and its exit
        if sig == signal.SIGTERM:  # after a hang-up there is no terminal to tell
            assert "stopping fleet fg: the router, then 1 replica(s)" in said and "fleet fg stopped; it cost $" in said
    finally:
        proc.kill()


def test_a_foreground_up_whose_stderr_is_gone_still_stops_gracefully(tmp_path, tiny_model, home):
    """`up 2>&1 | tee log` and Ctrl-C: tee died with it, the stop's first line raised EPIPE and the supervisor
    died halfway through the stop (exit 1, its fleet marked dead, requests in flight cut). A closed terminal's
    EIO did the same."""
    spec = write_spec(tmp_path, tiny_model, name="piped", replicas=1)
    proc = subprocess.Popen([sys.executable, "-m", "fleetserve", "up", spec], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **home})
    try:
        for line in proc.stdout:
            if line.startswith("endpoint:"):
                break
        assert status(home, "piped")[0]["status"] == "ready"
        proc.stdout.close()  # the reader is gone: every write from now on is EPIPE
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert leftovers(home) == []
        assert status(home, "piped")[0]["status"] == "stopped"
    finally:
        proc.kill()


def test_killed_supervisor_takes_its_children_along(tmp_path, tiny_model, home):
    """Also: a detached fleet's JSON supervisor.log is JSON lines only (its ready announcement had been five plain
    lines, "press Ctrl-C to stop" among them)."""
    import json
    from pathlib import Path

    spec = write_spec(tmp_path, tiny_model, name="orphan", replicas=1)
    Path(spec).write_text(Path(spec).read_text() + "  observability: {logFormat: json}\n")
    assert fleetserve("up", spec, "--detach", env=home).returncode == 0
    log = Path(home["FLEETSERVE_HOME"]) / "run" / "orphan" / "supervisor.log"
    wait_until(lambda: "ready" in log.read_text(), 30, what="the ready line")
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]  # each one JSON
    assert any("fleet orphan ready: 1 replica(s)" in line.get("message", line.get("msg", "")) for line in lines), lines
    (state,) = status(home)
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    wait_until(lambda: leftovers(home) == [], 30, what="children to die with their supervisor")
    (dead,) = status(home)
    assert dead["status"] == "dead"
    # the dead supervisor's last word is not shown as now: its router "up", pids of processes gone
    assert dead["router_status"] == "gone" and dead["router_pid"] is None and dead["prometheus_pid"] is None
    assert all(r["router_healthy"] is None for r in dead["replicas"])


def test_stop_with_stops_the_fleet_when_its_owner_is_killed(tmp_path, tiny_model, home):
    """A benchmark's fleet (`up --detach --stop-with PID`) must not outlive the benchmark, even SIGKILLed."""
    spec = write_spec(tmp_path, tiny_model, name="owned", replicas=1)
    bad = fleetserve("up", spec, "--detach", "--stop-with", "999999999", env=home)
    assert bad.returncode == 2 and "--stop-with" in bad.stderr and "no running process" in bad.stderr
    huge = fleetserve("up", spec, "--detach", "--stop-with", str(2**70), env=home)  # no traceback from os.kill
    assert huge.returncode == 2 and "--stop-with" in huge.stderr and "Traceback" not in huge.stderr
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        up = fleetserve("up", spec, "--detach", "--stop-with", str(owner.pid), env=home)
        assert up.returncode == 0, up.stderr
        assert status(home, "owned")[0]["status"] == "ready"
        owner.kill()
        owner.wait()
        wait_until(lambda: leftovers(home) == [], 60, what="the fleet to stop with its owner")
        stopped = status(home, "owned")[0]
        assert stopped["status"] == "stopped" and stopped["router_status"] == "stopped"
        assert stopped["nodes"] == [] and stopped["cost_per_hour"] == 0  # its nodes were given back: no cost runs
        shown = fleetserve("status", "owned", env=home).stdout  # a stopped fleet's node is not shown ready
        assert "instance type" not in shown
        if "prometheus:" in shown:
            assert "was; the fleet is stopped" in shown
    finally:
        owner.kill()


def test_engine_args_the_engine_lacks_or_the_fleet_sets_are_refused_before_anything_starts(tmp_path, tiny_model, home):
    """A flag the built-in engine lacks made each replica exit on its usage error, and `up` fail 11 s later with exit
    1 naming nothing of the spec; `--port 9999` passed, every replica served where nothing looked, and `up` waited
    out its startup timeout."""
    for args, says in (('"--max-batch", "4", "--bogus-flag"', "--bogus-flag is not an option of the built-in engine"),
                       ('"--port", "9999"', "--port is set by the fleet")):
        spec = write_spec(tmp_path, tiny_model, name="args", replicas=1, extra_engine=f", args: [{args}]")
        checked = fleetserve("validate", spec, env=home)
        assert checked.returncode == 0 and says in checked.stderr and "`fleetserve up` refuses" in checked.stderr
        up = fleetserve("up", spec, "--detach", env=home)
        assert up.returncode == 2 and f"spec.engine.args: {says.split(' is ')[0]}" in up.stderr, up.stderr
        assert leftovers(home) == []
    fine = write_spec(tmp_path, tiny_model, name="args", replicas=1, extra_engine=', args: ["--max-batch=4"]')
    assert "engine.args" not in fleetserve("validate", fine, env=home).stderr


def test_down_without_fleet_and_status_unknown_name(home):
    down = fleetserve("down", env=home)
    assert down.returncode == 1 and "no fleet is running" in down.stderr
    missing = fleetserve("status", "nope", env=home)  # a name no fleet has is bad input: 2 (it was 1)
    assert missing.returncode == 2 and "no fleet named 'nope' (known: none)" in missing.stderr
    missing = fleetserve("status", "nope", "--json", env=home)  # it exited 0 with --json
    assert missing.returncode == 2 and json.loads(missing.stdout) == {  # the one shape of bad input under --json
        "valid": False, "errors": [{"path": "NAME", "message": "no fleet named 'nope' (known: none)"}]}
    for args in (["down", "nope"], ["status", "--prune", "nope"], ["dashboard", "open", "nope"]):
        assert fleetserve(*args, env=home).returncode == 2, args




def test_fleet_starts_its_own_redis_for_l2_and_stops_it(tmp_path, tiny_model, home):
    import shutil

    import httpx

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    spec = write_spec(tmp_path, tiny_model, name="tiers", replicas=1)
    with open(spec, "a") as f:
        f.write("  kvCache: {blockSize: 16, l1: {enabled: true, maxBytes: 67108864}, "
                "l2: {enabled: true, maxBytes: 134217728}}\n")
    up = fleetserve("up", spec, "--detach", env=home)
    assert up.returncode == 0, up.stderr
    (state,) = status(home)
    # on a unix socket in the 0700 run folder: on a TCP port, a process that bound it while Redis restarted got
    # every engine's AUTH, password and all
    assert state["l2_url"].startswith("unix://") and state["l2_url"].endswith("/run/tiers/redis.sock?db=0")
    sock = state["l2_url"].removeprefix("unix://").split("?")[0]
    assert os.stat(sock).st_mode & 0o077 == 0 and os.stat(os.path.dirname(sock)).st_mode & 0o077 == 0
    body = {"model": "tiny", "prompt": "a shared prefix that is long enough to fill blocks " * 4, "max_tokens": 2}
    first = httpx.post(state["url"] + "/completions", json=body, timeout=60).json()
    again = httpx.post(state["url"] + "/completions", json=body, timeout=60).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    # the supervisor pings L2 for status: a stopped (SIGSTOP) Redis read "up" before

    os.kill(state["redis_pid"], signal.SIGSTOP)
    try:
        wait_until(lambda: fleet_status(home)[0]["l2_status"].startswith("not answering"), 60, what="L2 not answering")
        assert "l2: unix://" in fleetserve("status", env=home, check=True).stdout
    finally:
        os.kill(state["redis_pid"], signal.SIGCONT)
    wait_until(lambda: fleet_status(home)[0]["l2_status"] == "up", 60, what="L2 up again")
    assert fleetserve("down", env=home).returncode == 0
    assert leftovers(home) == []  # redis-server included


def _a_long_stream_under_way(tmp_path, home, name: str) -> tuple[dict, object]:
    """A one-replica fleet of a model slow enough that a 1,500-token stream outlasts any stop signal, and that
    stream's chunks once the first arrived: (the fleet's status, the rest of the chunks)."""
    from fleetserve.engine.tiny import create_tiny_model

    model = create_tiny_model(tmp_path / "slower", hidden_size=384, layers=6, context_length=2048)
    spec = write_spec(tmp_path, str(model), name=name, replicas=1)
    up = fleetserve("up", spec, "--detach", env=home)
    assert up.returncode == 0, up.stderr
    (state,) = status(home, name)
    client = openai.OpenAI(base_url=state["url"], api_key="x", max_retries=0, timeout=120)
    stream = client.completions.create(model="tiny", prompt="count", max_tokens=1500, stream=True,
                                       extra_body={"ignore_eos": True, "stream_options": {"include_usage": True}})
    chunks = iter(stream)
    next(chunks)  # the stream is under way
    return state, chunks


def test_down_lets_a_stream_under_way_finish_before_the_replicas_stop(tmp_path, home):
    """`fleetserve down` signalled the router and every replica at once: a stream under way ended in a bare
    connection reset (the openai client's APIConnectionError). The router now stops first and lets it finish
    while the replicas still run."""
    import threading

    _, chunks = _a_long_stream_under_way(tmp_path, home, "drain")
    stopping = threading.Thread(target=fleetserve, args=("down", "drain"), kwargs={"env": home})
    stopping.start()
    rest = list(chunks)  # raised APIConnectionError before
    stopping.join(timeout=180)
    usage = next(c.usage for c in reversed(rest) if c.usage is not None)
    assert usage.completion_tokens == 1500 and not stopping.is_alive()
    assert leftovers(home) == [] and status(home, "drain")[0]["status"] == "stopped"


def test_a_stream_under_way_finishes_when_the_supervisor_is_killed(tmp_path, home):
    """A SIGKILLed supervisor (kill -9, the OOM killer) took its engines with it (PR_SET_PDEATHSIG SIGKILL): every
    stream in flight was cut ("the model replica failed mid-stream"). The router drains on its SIGTERM; the
    engines now get SIGUSR1 and drain as long, then exit: nothing is left behind."""
    import threading

    state, chunks = _a_long_stream_under_way(tmp_path, home, "orphan")
    # and a request answered whole at its end: the engine's closed listener read as a replica gone silent, and it
    # was cut mid-generation (503 router_stopping, its work thrown away)
    client = openai.OpenAI(base_url=state["url"], api_key="x", max_retries=0, timeout=180)
    whole: list = []
    asked = threading.Thread(target=lambda: whole.append(client.completions.create(
        model="tiny", prompt="count", max_tokens=1000, extra_body={"ignore_eos": True})))
    asked.start()
    wait_until(lambda: _engine_running(state) >= 2, 30, what="both requests on the engine")
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    rest: list = []
    reader = threading.Thread(target=lambda: rest.extend(chunks))
    reader.start()
    reader.join(timeout=180)
    asked.join(timeout=180)
    usage = next(c.usage for c in reversed(rest) if c.usage is not None)
    assert usage.completion_tokens == 1500 and not reader.is_alive()
    assert whole and whole[0].usage.completion_tokens == 1000
    wait_until(lambda: leftovers(home) == [], 60, what="the router and the engine exited after their drain")


def _engine_running(state: dict) -> int:
    """Requests the fleet's one engine is running, from its /health body."""
    import httpx

    try:
        return int(httpx.get(state["replicas"][0]["url"] + "/health", timeout=5).json().get("running", 0))
    except (httpx.HTTPError, ValueError):
        return 0


def test_a_dead_supervisors_pid_taken_by_another_process_is_not_the_fleet(home, tmp_path):
    """The state keeps the supervisor's pid; once it died, and the pid went to another process (a reboot, a
    long uptime), `status` read the fleet ready, `up` refused to start it, and `down` SIGTERMed that process."""
    from fleetserve.fleet.state import FleetState

    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        run = tmp_path / "home" / "run" / "gone"
        run.mkdir(parents=True)
        state = FleetState(name="gone", namespace="default", model="tiny", spec_path="/x.yaml", status="ready",
                           supervisor_pid=stranger.pid, supervisor_start="1", url="http://127.0.0.1:1/v1")
        (run / "state.json").write_text(json.dumps(state.to_json()))
        (shown,) = status(home, "gone")
        assert shown["status"] != "ready", shown
        assert fleetserve("down", "gone", env=home).returncode == 0
        assert stranger.poll() is None  # untouched
    finally:
        stranger.kill()
        stranger.wait()


def test_replicas_zero_without_autoscaling_answers_at_once_and_says_why(tmp_path, tiny_model, home):
    """Nothing wakes such a fleet: status promised "the next request wakes it" while requests waited out the
    buffer timeout (10 minutes by default) for a 503 naming nothing."""
    spec = write_spec(tmp_path, tiny_model, name="paused", replicas=0)
    checked = fleetserve("validate", spec, env=home)
    assert checked.returncode == 0 and "spec.replicas: 0 with no autoscaling" in checked.stdout + checked.stderr
    up = fleetserve("up", spec, "--detach", env=home)
    assert up.returncode == 0, up.stderr
    try:
        (state,) = status(home)
        assert state["serving"] == "no replica wanted; see error" and "no autoscaling" in state["error"]
        client = openai.OpenAI(base_url=state["url"], api_key="x", max_retries=0, timeout=30)
        with pytest.raises(openai.APIStatusError) as info:
            client.completions.create(model="tiny", prompt="hi", max_tokens=2)
        assert info.value.status_code == 503 and "spec.replicas is 0" in str(info.value)
    finally:
        assert fleetserve("down", env=home).returncode == 0
    assert leftovers(home) == []


def test_a_state_without_the_supervisors_start_time_trusts_only_a_fleetserve_process():
    """States written before start times were recorded: the pid must at least be a fleetserve process."""
    from fleetserve.fleet.state import FleetState, supervisor_alive

    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "fleetserve", "up"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        def state(pid):
            return FleetState(name="old", namespace="default", model="m", spec_path="/x.yaml", supervisor_pid=pid)

        assert supervisor_alive(state(ours.pid)) and not supervisor_alive(state(other.pid))
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()


def test_a_fleets_logs_past_their_limit_are_rotated_while_it_serves(tmp_path, tiny_model, home):
    """The run folder's logs grew without end (about 370 bytes a request across the router's and an engine's)."""
    from pathlib import Path

    spec = Path(write_spec(tmp_path, tiny_model, name="rot", replicas=1))
    spec.write_text(spec.read_text() + "  observability: {logMaxBytes: 1}\n")  # every line past it: rotated
    assert fleetserve("up", str(spec), "--detach", env=home).returncode == 0
    try:
        folder = Path(home["FLEETSERVE_HOME"]) / "run" / "rot"
        wait_until(lambda: (folder / "logs" / "r0.log.1").exists() and (folder / "logs" / "router.log.1").exists()
                   and (folder / "supervisor.log.1").exists(), 60, what="the first rotation")
        client = openai.OpenAI(base_url=status(home)[0]["url"], api_key="x", max_retries=0)
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        wait_until(lambda: (folder / "logs" / "router.log").stat().st_size > 0, 30, what="new router lines")
        assert b"\0" not in (folder / "logs" / "router.log").read_bytes()[:64]  # written from the start: no hole
    finally:
        assert fleetserve("down", "rot", env=home).returncode == 0


def test_down_of_a_dead_fleet_leaves_a_stopped_record_without_stale_replicas_or_running_cost(home, tmp_path):
    """After `down` of a fleet whose supervisor had been SIGKILLed, status read the fleet stopped but its replica
    rows "stale", and printed "$X so far" and its last decision as if it still ran."""
    from fleetserve.fleet.state import FleetState, ReplicaState

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs
    run = tmp_path / "home" / "run" / "dead"
    run.mkdir(parents=True)
    state = FleetState(name="dead", namespace="default", model="tiny", spec_path="/x.yaml", status="ready",
                       supervisor_pid=gone.pid, supervisor_start="1", url="http://127.0.0.1:1/v1", cost_total=0.25,
                       cost_per_hour=1.0, last_decision={"desired": 2, "reason": "steady at 2"},
                       replicas=[ReplicaState("r0", "http://127.0.0.1:2", state="ready", pid=gone.pid)])
    (run / "state.json").write_text(json.dumps(state.to_json()))
    assert fleetserve("down", "dead", env=home).returncode == 0
    again = fleetserve("down", "dead", env=home)  # `down` twice is done, not a failure (it exited 1)
    assert again.returncode == 0 and "fleet dead is not running (stopped already)" in again.stdout, again
    unnamed = fleetserve("down", env=home)  # the only fleet, stopped: done too
    assert unnamed.returncode == 0 and "no fleet is running (dead: stopped already)" in unnamed.stdout, unnamed
    assert fleetserve("dashboard", "open", "dead", env=home).returncode == 1  # nothing to open: the fleets' state
    (shown,) = status(home, "dead")
    assert shown["status"] == "stopped" and [r["state"] for r in shown["replicas"]] == ["stopped"], shown
    text = fleetserve("status", "dead", env=home, check=True).stdout
    assert "it cost $0.2500 in all" in text and "so far" not in text, text
    assert "last decision (before it stopped): 2 replica(s)" in text


def test_a_process_that_binds_a_crashed_replicas_port_is_never_taken_for_it(tmp_path, tiny_model, home):
    """After a replica crashed, a local process that bound its port first was taken for it: the supervisor said
    "ready again", the router sent it every other client request and probed it with the internal token. Each
    start now proves its own secret to each probe and on each of the router's fresh connections; what answers
    otherwise gets nothing, no token either, not even in the moment before the supervisor sees the crash."""
    import http.server
    import threading
    import time

    spec = write_spec(tmp_path, tiny_model, name="squat")
    up = fleetserve("up", spec, "--detach", env=home)
    assert up.returncode == 0, up.stderr
    try:
        (state,) = status(home)
        victim = state["replicas"][0]
        port = int(victim["url"].rsplit(":", 1)[1])
        seen: list[tuple[str, str, str | None]] = []
        import httpx

        # what any local process can read from the real one: its proof for a challenge of its own choosing, which
        # it replays to the supervisor's and the router's probes (an id echoed as is had passed them)
        replayed = httpx.get(victim["url"] + "/health", headers={"x-fleetserve-challenge": "c0ffee"},
                             timeout=10).content
        assert b'"instance"' in replayed

        class Squatter(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                seen.append((self.command, self.path, self.headers.get("authorization")))
                body = replayed
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *_):
                pass

        os.kill(victim["pid"], signal.SIGKILL)
        server = None
        deadline = time.monotonic() + 5
        while server is None:
            try:
                server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Squatter)
            except OSError:
                assert time.monotonic() < deadline, "the crashed replica's port never came free"
                time.sleep(0.02)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            # from the moment it binds the port nothing reaches it, neither a request nor the token: the router's
            # fresh connections prove the replica before anything goes on them (the dead one's closed with it), so
            # what it routed there before its supervisor's next round pushed the restart goes to the other replica
            client = openai.OpenAI(base_url=state["url"], api_key="x", max_retries=0, timeout=60)
            for _ in range(10):  # the other replica answers them all
                reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                                       max_tokens=2)
                assert reply.choices[0].message is not None

            def moved():  # the restart finds its port taken and starts on another
                r = fleet_status(home)[0]["replicas"][0]
                return r["state"] == "ready" and r["url"] != victim["url"]

            wait_until(moved, 120, interval=0.5, what="the replica restarted on another port")
            assert status(home)[0]["replicas"][0]["restarts"] >= 1
            assert not [s for s in seen if s[0] == "POST"], seen  # no client request reached it
            assert not [s for s in seen if s[2]], seen  # nor the internal token
        finally:
            server.shutdown()
            server.server_close()
    finally:
        fleetserve("down", "squat", env=home)


def test_up_refuses_at_once_a_count_the_machines_slots_cannot_hold(tmp_path, tiny_model, home):
    """`replicas: 2` on `localSlots: 1` served one replica while `up` waited out startupTimeoutSeconds (10 min by
    default) and exited 1; slots free up only as replicas drain, and none does while starting (found in review)."""
    spec = write_spec(tmp_path, tiny_model, name="over")
    with open(spec, "a") as f:
        f.write("  capacity: {localSlots: 1}\n")
    up = fleetserve("up", spec, "--detach", env=home, timeout=300)
    assert up.returncode == 2, (up.stdout, up.stderr)
    # before anything starts: it had prepared the model and started the router and one replica, 11 s later
    assert "spec.capacity.localSlots: 1 slot(s) cannot hold the 2 replicas of spec.replicas" in up.stderr, up.stderr
    assert leftovers(home) == [] and not fleet_status(home)  # no fleet recorded
