"""Finding 5: bad input is a 400 naming the field, never a 500 (router features, lone surrogates)."""

import json

import pytest

from fleetserve.api.errors import APIError
from fleetserve.api.protocol import parse_chat, parse_completion, parse_json_body
from fleetserve.router.features import KVLayout, request_features


@pytest.mark.parametrize("content", [[{"type": "text", "text": 5}], [None], None, 7, [{"text": None}], {"a": 1}])
def test_router_features_are_total_over_any_content(content):
    keys, tokens, _, exact = request_features({"messages": [{"role": "user", "content": content}]}, KVLayout())
    assert not exact and tokens >= 0 and isinstance(keys, tuple)


def test_lone_surrogate_in_content_is_a_400_naming_the_field():
    body = parse_json_body(json.dumps({"messages": [{"role": "user", "content": "a\ud800b"}]}).encode())
    with pytest.raises(APIError) as err:
        parse_chat(body)
    assert err.value.status == 400 and err.value.param == "messages[0].content"


@pytest.mark.parametrize("body,param", [
    ({"prompt": "\udfff"}, "prompt"),
    ({"prompt": "ok", "stop": ["\ud800"]}, "stop"),
    ({"prompt": "ok", "cache_salt": "\ud800"}, "cache_salt"),
])
def test_lone_surrogates_anywhere_are_400(body, param):
    with pytest.raises(APIError) as err:
        parse_completion(parse_json_body(json.dumps(body).encode()))
    assert err.value.param == param


def test_text_parts_with_a_surrogate_name_the_part():
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}
    with pytest.raises(APIError) as err:
        parse_chat(parse_json_body(json.dumps(body).encode()))
    assert err.value.param == "messages[0].content[0].text"
