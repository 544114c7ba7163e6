"""The command line: exit codes and messages for bad input."""

from pathlib import Path

from tests.helpers import fleetserve

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_help_lists_commands():
    result = fleetserve("--help")
    assert result.returncode == 0
    for command in ("up", "down", "status", "validate", "engine", "router", "model"):
        assert command in result.stdout


def test_version_flag_prints_the_version_as_the_command_does():
    """`fleetserve --version` (what users try first) was "No such option", exit 2."""
    from fleetserve import __version__

    for args in (("--version",), ("version",), ("--version", "validate")):
        result = fleetserve(*args)
        assert result.returncode == 0 and result.stdout.strip() == __version__, (args, result.stderr)


def test_validate_examples():
    result = fleetserve("validate", str(EXAMPLES / "quickstart.yaml"))
    assert result.returncode == 0 and "valid fleetserve spec" in result.stdout
    result = fleetserve("validate", str(EXAMPLES / "hyperpod.yaml"))
    assert result.returncode == 0 and "valid hyperpod spec" in result.stdout
    assert "warning: spec.endpointName" in result.stderr


def test_validate_wrong_field_prints_path_and_exits_2(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text((EXAMPLES / "quickstart.yaml").read_text().replace("strategy: leastload", "strategy: fastest"))
    result = fleetserve("validate", str(spec))
    assert result.returncode == 2
    assert "spec.routing.strategy" in result.stderr and "'fastest'" in result.stderr
    assert "leastload" in result.stderr


def test_validate_json_output(tmp_path):
    import json

    result = fleetserve("validate", str(EXAMPLES / "hyperpod.yaml"), "--json")
    data = json.loads(result.stdout)
    assert data["format"] == "hyperpod" and data["endpoint"]["spec"]["routing"]["strategy"] == "prefixaware"
    assert data["valid"] is True
    bad = tmp_path / "bad.yaml"
    bad.write_text((EXAMPLES / "quickstart.yaml").read_text().replace("strategy: leastload", "strategy: fastest"))
    result = fleetserve("validate", str(bad), "--json")  # problems on stdout too, for tools
    data = json.loads(result.stdout)
    assert result.returncode == 2 and data["valid"] is False
    assert data["errors"][0]["path"] == "spec.routing.strategy" and "leastload" in data["errors"][0]["message"]


def test_validate_for_kubernetes_fails_where_render_refuses_and_lists_renders_warnings(tmp_path):
    """`validate` exited 0 for a spec `render k8s` refused (4 GPUs a replica on a 1-GPU type), and showed none of
    render's warnings (a token written in engine.env): a CI that gated on validate passed both (found in review)."""
    import json

    four = tmp_path / "four.yaml"
    four.write_text((EXAMPLES / "hyperpod.yaml").read_text().replace('nvidia.com/gpu: "1"', 'nvidia.com/gpu: "4"'))
    assert fleetserve("validate", str(four)).returncode == 0  # locally it is a note
    result = fleetserve("validate", "--kubernetes", str(four))
    assert result.returncode == 2 and "render k8s refuses it: spec.placement: no listed instance type" in result.stderr
    result = fleetserve("validate", "--kubernetes", "--json", str(four))
    assert result.returncode == 2 and json.loads(result.stdout)["valid"] is False
    (error,) = json.loads(result.stdout)["errors"]
    assert error["path"] == "spec.placement" and error["message"].startswith("render k8s refuses it: no listed")
    result = fleetserve("render", "k8s", "--json", str(four))  # its stdout had been empty
    assert result.returncode == 2 and json.loads(result.stdout)["errors"][0]["path"] == "spec.placement"
    token = tmp_path / "token.yaml"
    token.write_text((EXAMPLES / "quickstart.yaml").read_text().replace(
        "    kind: builtin\n", "    kind: builtin\n    env: {HF_TOKEN: hf_abc}\n"))
    plain = fleetserve("validate", str(token))
    assert plain.returncode == 0 and "plain text" not in plain.stderr
    result = fleetserve("validate", "--kubernetes", str(token))
    assert result.returncode == 0 and "spec.engine.env.HF_TOKEN: a credential" in result.stderr, result.stderr


def test_validate_warns_of_a_local_model_folder_that_up_would_refuse(tmp_path, tiny_model):
    """validate called such a spec valid without a word; `up` then exited 2 on it."""
    import json

    text = ("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {{name: m}}\n"
            "spec: {{model: {{name: m, source: {}}}}}\n")
    spec = tmp_path / "m.yaml"
    spec.write_text(text.format(tmp_path / "absent"))
    result = fleetserve("validate", str(spec), "--json")
    assert result.returncode == 0  # a warning: the spec may be meant for another machine
    (warning,) = [w for w in json.loads(result.stdout)["warnings"] if w.startswith("spec.model.source")]
    assert "does not exist" in warning and "fleetserve up" in warning
    (tmp_path / "empty").mkdir()
    spec.write_text(text.format(tmp_path / "empty"))
    assert "missing config.json" in fleetserve("validate", str(spec)).stderr
    spec.write_text(text.format(tiny_model))
    assert "spec.model.source" not in fleetserve("validate", str(spec)).stderr


def test_validate_warns_of_l1_tiers_this_machine_cannot_hold(tmp_path, tiny_model):
    """`l1.maxBytes: 1Ti` per replica on a machine of a few GiB passed without a word (found in a black-box pass):
    each engine holds its L1 in its own memory."""
    import json

    spec = tmp_path / "l1.yaml"
    text = ("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {{name: m}}\n"
            "spec: {{model: {{name: m, source: {}}}, replicas: 2, kvCache: {{l1: {{maxBytes: {}}}}}}}\n")
    spec.write_text(text.format(tiny_model, "64Pi"))
    result = fleetserve("validate", str(spec), "--json")
    assert result.returncode == 0, result.stderr
    (warning,) = [w for w in json.loads(result.stdout)["warnings"] if w.startswith("spec.kvCache.l1.maxBytes")]
    assert "2 replica(s) x" in warning and "more than this machine's" in warning
    spec.write_text(text.format(tiny_model, "1Mi"))
    assert "spec.kvCache.l1.maxBytes" not in fleetserve("validate", str(spec)).stderr


def test_validate_warns_of_tls_files_that_up_would_refuse(tmp_path):
    """`tls: {certFile: /nonexistent.crt, ...}` validated without a word; `up` then exited 2 naming the field."""
    import json

    spec = tmp_path / "t.yaml"
    spec.write_text("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: t}\nspec: {model: {source: "
                    f"builtin:smollm2-135m}}, tls: {{enabled: true, certFile: {tmp_path / 'no.crt'}, keyFile: "
                    f"{tmp_path / 'no.key'}}}}}\n")
    result = fleetserve("validate", str(spec), "--json")
    assert result.returncode == 0, result.stderr
    (warning,) = [w for w in json.loads(result.stdout)["warnings"] if w.startswith("spec.tls")]
    assert "spec.tls.certFile" in warning and "no such file" in warning and "fleetserve up" in warning


def test_an_unusable_fleetserve_home_is_exit_2_naming_it(tmp_path):
    """FLEETSERVE_HOME naming a file gave a NotADirectoryError traceback from `up`."""
    home = tmp_path / "a-file"
    home.write_text("")
    spec = tmp_path / "q.yaml"
    spec.write_text("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: q}\n"
                    "spec: {model: {source: builtin:smollm2-135m}}\n")
    result = fleetserve("up", str(spec), "--detach", env={"FLEETSERVE_HOME": str(home)})
    assert result.returncode == 2 and "FLEETSERVE_HOME" in result.stderr and "Traceback" not in result.stderr


def test_validate_missing_file_exits_2(tmp_path):
    result = fleetserve("validate", str(tmp_path / "none.yaml"))
    assert result.returncode == 2 and "cannot read" in result.stderr


def test_up_with_invalid_spec_exits_2(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: x}\nspec: {replicas: 1}\n")
    result = fleetserve("up", str(spec))
    assert result.returncode == 2 and "spec.model: required field is missing" in result.stderr


def test_router_rejects_unknown_strategy():
    result = fleetserve("router", "--strategy", "fastest", "--backend", "http://127.0.0.1:1")
    assert result.returncode == 2 and "roundrobin" in result.stderr and "leastload" in result.stderr


def test_engine_with_missing_model_exits_2(tmp_path):
    result = fleetserve("engine", "--model", str(tmp_path / "missing"), "--port", "1")
    assert result.returncode == 2 and "does not exist" in result.stderr


def test_engine_secret_files_that_cannot_be_read_exit_2_naming_the_flag(tmp_path):
    """Both were Python tracebacks (exit 1) after the model had loaded; a Redis password is any length Redis
    takes, not a token of at least 16 characters."""
    from fleetserve.api.internal import read_secret_file

    for flag in ("--internal-token-file", "--l2-password-file"):
        result = fleetserve("engine", "--simulate", "h100-8b", flag, str(tmp_path / "nope"), "--port", "1")
        assert result.returncode == 2 and flag in result.stderr and "Traceback" not in result.stderr, result.stderr
    (tmp_path / "pw").write_text("short\n")
    assert read_secret_file(tmp_path / "pw") == "short"
    tenant = fleetserve("engine", "--model", "x", "--l2-tenant", "alpha", "--port", "1")
    assert tenant.returncode == 2 and "expected TENANT=URL" in tenant.stderr
    twice = fleetserve("engine", "--model", "x", "--l2-tenant", "a=redis://h/1", "--l2-tenant", "a=redis://h/2",
                       "--port", "1")  # the last one had won without a word
    assert twice.returncode == 2 and "tenant 'a' is given twice" in twice.stderr


def test_a_tenant_database_on_the_shared_l2_server_takes_its_password_and_no_other_server_does():
    from fleetserve.kvcache.redis_urls import same_server_password

    shared = "redis://127.0.0.1:6380/0"
    assert same_server_password("redis://127.0.0.1:6380/1", shared, "pw") == "pw"
    assert same_server_password("redis://127.0.0.1:6381/1", shared, "pw") is None  # another server
    assert same_server_password("redis://:own@127.0.0.1:6380/1", shared, "pw") is None  # its own credentials
    assert same_server_password("redis://localhost/2", "redis://localhost:6379/0", "pw") == "pw"  # default port
    assert same_server_password("unix:///run/r.sock?db=1", "unix:///run/r.sock", "pw") == "pw"
    assert same_server_password("redis://127.0.0.1:6380/1", shared, None) is None
    assert same_server_password("redis://127.0.0.1:6380/1", "redis://:inurl@127.0.0.1:6380/0", None) == "inurl"
    assert same_server_password("redis://localhost:6380/1", shared, "pw") == "pw"  # one machine, two spellings


def test_model_prepare_unknown_builtin():
    result = fleetserve("model", "prepare", "builtin:gpt-9")
    assert result.returncode == 2 and "smollm2-135m" in result.stderr


def test_trace_model_on_a_trace_that_is_not_servegen_names_the_option():
    result = fleetserve("simulate", str(EXAMPLES / "quickstart.yaml"), "--trace",
                        str(Path(__file__).parents[1] / "data" / "mooncake_sample.jsonl"), "--trace-model", "x")
    assert result.returncode == 2 and "--trace-model" in result.stderr and "ServeGen" in result.stderr


def test_model_prepare_unsupported_scheme_names_the_allowed_ones():  # was "/cwd/gs:/bucket does not exist"
    result = fleetserve("model", "prepare", "gs://bucket/model")
    assert result.returncode == 2 and "scheme gs://" in result.stderr and "s3://bucket/prefix" in result.stderr


def test_every_example_validates():
    for spec in sorted(EXAMPLES.glob("*.yaml")):
        result = fleetserve("validate", str(spec))
        assert result.returncode == 0, (spec.name, result.stderr)


def _commands(typer_app):
    """Every command function of a typer app, its sub-apps' included."""
    for command in typer_app.registered_commands:
        yield command.callback
    for group in typer_app.registered_groups:
        yield from _commands(group.typer_instance)


def test_every_float_flag_refuses_nan_and_inf_naming_the_flag():
    """A flag declared with plain `typer.Option` lets inf through its bounds and answers nan with the bound
    ("should be >= 1"): every float flag goes through `float_option`, which names the value and the range."""
    import typing

    from fleetserve.cli.app import app

    floats = []
    for function in _commands(app):
        for name, hint in typing.get_type_hints(function, include_extras=True).items():
            if typing.get_origin(hint) is typing.Annotated and float in (hint.__origin__, *typing.get_args(
                    hint.__origin__)):
                option = hint.__metadata__[0]
                floats.append(name)
                assert option.parser is not None and option.parser.__qualname__.startswith("_bounded"), \
                    f"{function.__name__}: --{name.replace('_', '-')} is not a float_option"
    assert len(floats) >= 30, floats  # the walk found the flags, not nothing


def test_a_float_flag_of_nan_inf_or_out_of_range_is_exit_2_with_the_value():
    spec = str(EXAMPLES / "quickstart.yaml")
    for value, says in (("nan", "nan: must be a finite number [x>=1]"), ("inf", "inf: must be a finite number"),
                        ("0.5", "0.5 is not in the range [x>=1]"), ("abc", "'abc' is not a number")):
        result = fleetserve("simulate", spec, "--trace", "missing.jsonl", "--window", value)
        assert result.returncode == 2 and "--window" in result.stderr and says in result.stderr, result.stderr


def test_a_report_never_overwrites_the_profile_or_prices_it_reads(tmp_path):
    """`simulate --profile prof.json --report prof.json` replaced the profile with the HTML report."""
    prices = tmp_path / "prices.yaml"
    prices.write_text("g6e.xlarge: 1.5\n")
    before = prices.read_text()
    trace = Path(__file__).parents[1] / "data" / "mooncake_sample.jsonl"
    r = fleetserve("simulate", str(EXAMPLES / "simulated-cloud.yaml"), "--trace", str(trace), "--limit", "5",
                   "--prices", str(prices), "--report", str(prices))
    said = " ".join(r.stderr.replace("│", " ").split())  # the error box wraps where the tmp path's length puts it
    assert r.returncode == 2 and "is the command's input" in said and prices.read_text() == before


def test_outputs_under_a_file_or_onto_a_folder_are_exit_2_not_tracebacks(tmp_path):
    """`dashboard grafana -o` into a missing folder, onto a folder or under a file, and `model tiny` under a file,
    were Python tracebacks with exit 1."""
    a_file = tmp_path / "plain.txt"
    a_file.write_text("x")
    for args in (["dashboard", "grafana", "-o", str(tmp_path)], ["dashboard", "grafana", "-o", f"{a_file}/d.json"],
                 ["model", "tiny", f"{a_file}/m"]):
        r = fleetserve(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
    made = tmp_path / "new" / "folder" / "d.json"  # a missing folder is made, as plan -o and --report make theirs
    assert fleetserve("dashboard", "grafana", "-o", str(made)).returncode == 0 and made.exists()


def test_an_l2_size_beside_an_l2_url_is_warned(tmp_path):
    """maxBytes sizes the Redis fleetserve starts: beside a Redis of the user's own it changed nothing, unsaid."""
    spec = tmp_path / "l2.yaml"
    spec.write_text("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: m}\nspec:\n"
                    "  model: {name: m, source: builtin:smollm2-135m}\n"
                    "  kvCache: {l2: {enabled: true, url: 'redis://127.0.0.1:6399/0', maxBytes: 1000000}}\n")
    assert "spec.kvCache.l2.maxBytes" in fleetserve("validate", str(spec)).stderr
    spec.write_text(spec.read_text().replace(", maxBytes: 1000000", ""))
    assert "maxBytes" not in fleetserve("validate", str(spec)).stderr
