"""What the fuzzers (tests/fuzz) found, each pinned by a test that failed before its fix."""

from __future__ import annotations

import pytest
import torch

from fleetserve.api.protocol import parse_completion
from fleetserve.engine.sampling import choose_token


@pytest.mark.parametrize("sampling", [
    {"top_p": 5e-324},  # rounds to 0 in float32: no token was kept, multinomial raised (a 500 / error event)
    {"top_p": 1e-46},
    {"temperature": 5e-324},  # logits / temperature overflowed to inf, softmax gave NaN
    {"temperature": 1e-30, "top_p": 0.5},
])
def test_tiny_top_p_and_temperature_sample_a_token(sampling):
    parsed = parse_completion({"prompt": "x", **sampling})
    logits = torch.linspace(-30.0, 30.0, 1000)
    token = choose_token(logits, parsed.sampling, torch.Generator().manual_seed(0), {})
    assert token == 999  # the meaning is kept: top-1 / greedy


def test_tiny_values_keep_their_meaning_and_normal_values_pass_unchanged():
    assert parse_completion({"prompt": "x", "temperature": 1e-9}).sampling.temperature == 0.0
    assert parse_completion({"prompt": "x", "top_p": 5e-324}).sampling.top_p > 0.0
    plain = parse_completion({"prompt": "x", "temperature": 0.7, "top_p": 0.9}).sampling
    assert (plain.temperature, plain.top_p) == (0.7, 0.9)


@pytest.mark.parametrize("api_version", [["fleetserve.io/v1"], {"a": 1}])
def test_an_unhashable_api_version_is_a_spec_error(api_version):
    from fleetserve.spec import SpecError
    from fleetserve.spec.load import load_spec_data

    with pytest.raises(SpecError) as err:  # was TypeError: unhashable type
        load_spec_data({"apiVersion": api_version, "kind": "Endpoint", "metadata": {"name": "x"}, "spec": {}})
    assert err.value.problems[0].path == "apiVersion"


@pytest.mark.parametrize("limits", [[1], "1", 3])
def test_hyperpod_resources_that_are_not_mappings_are_a_spec_error(limits):
    from pathlib import Path

    import yaml

    from fleetserve.spec import SpecError
    from fleetserve.spec.load import load_spec_data

    doc = yaml.safe_load((Path(__file__).parents[2] / "examples" / "hyperpod.yaml").read_text())
    doc["spec"]["worker"]["resources"] = {"limits": limits}
    with pytest.raises(SpecError) as err:  # was AttributeError: 'list' object has no attribute 'get'
        load_spec_data(doc)
    problem = err.value.problems[0]  # the CRD-based validation names the exact field
    assert problem.path == "spec.worker.resources.limits" and "mapping" in problem.message


def test_a_tenant_that_contains_the_separator_is_not_a_tenant_plus_a_client_salt():
    from fleetserve.kvcache.blocks import kv_salt, namespace_key

    assert kv_salt("a\0client:b") != kv_salt("a", "b")  # was the same salt: one cache namespace
    assert namespace_key("m", salt=kv_salt("a\0client:b")) != namespace_key("m", salt=kv_salt("a", "b"))
    assert kv_salt("alpha") == "tenant:alpha" and kv_salt("a", "b") == "tenant:a\0client:b"  # keys kept


def test_namespace_fields_cannot_shift_into_each_other_and_accept_any_text():
    from fleetserve.kvcache.blocks import namespace_key

    assert namespace_key("m\0x", "1") != namespace_key("m", "x\0" + "1")  # was equal
    assert namespace_key("m\ud800") != namespace_key("m")  # was UnicodeEncodeError


def test_a_bad_nested_flag_names_its_full_parameter():
    """Found by the fuzzer: `stream_options.include_usage: 5e16` was reported as param 'include_usage', which is
    no top-level parameter of the request."""
    from fleetserve.api.errors import APIError
    from fleetserve.api.protocol import parse_completion

    with pytest.raises(APIError) as err:
        parse_completion({"prompt": "x", "stream": True, "stream_options": {"include_usage": 5.3e16}})
    assert err.value.param == "stream_options.include_usage"
