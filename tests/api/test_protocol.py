import pytest

from fleetserve.api import protocol
from fleetserve.api.errors import APIError
from fleetserve.api.protocol import parse_chat, parse_completion, parse_json_body

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def error_of(fn, body) -> APIError:
    with pytest.raises(APIError) as info:
        fn(body)
    return info.value


DEEP = b'{"model": "m", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # 200 KB: a 500 (RecursionError)
DEEP_AND_ODD = b'{"x": ' + b"[" * 1000 + b"]" * 1000 + b', "y": 1e400}'  # orjson refuses 1e400, the stdlib recursed

LONG_INT = b'{"max_tokens": ' + b"9" * 5000 + b"}"  # past Python's 4,300-digit conversion limit: it was a 500


@pytest.mark.parametrize("raw", [b"", b"{bad", b"[1, 2]", b"\xff\xfe", DEEP, DEEP_AND_ODD, LONG_INT])
def test_malformed_json_is_400(raw):
    err = error_of(parse_json_body, raw)
    assert err.status == 400 and err.code == "invalid_json"


@pytest.mark.parametrize(
    "change, param",
    [
        ({"messages": None}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": "ten"}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"n": 2}, "n"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"model": 7}, "model"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_bad_chat_parameters_name_the_parameter(change, param):
    body = {**CHAT, **change}
    if change.get("messages") is None and "messages" in change:
        del body["messages"]
    err = error_of(parse_chat, body)
    assert err.status == 400
    assert err.param == param
    assert err.body()["error"]["type"] == "invalid_request_error"


def test_chat_defaults_and_text_parts():
    parsed = parse_chat({**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                              {"type": "text", "text": "b"}]}]})
    assert parsed.messages == [{"role": "user", "content": "ab"}]
    assert parsed.sampling.temperature == 1.0 and parsed.sampling.max_tokens is None and not parsed.stream


def test_max_completion_tokens_wins_and_stop_string():
    parsed = parse_chat({**CHAT, "max_tokens": 5, "max_completion_tokens": 7, "stop": "\n"})
    assert parsed.sampling.max_tokens == 7 and parsed.sampling.stop == ("\n",)


def test_stream_usage_option():
    parsed = parse_chat({**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert parsed.stream and parsed.include_usage


def test_stream_options_the_engines_cannot_honour_are_refused_and_unknown_ones_logged(caplog, monkeypatch):
    """continuous_usage_stats (vLLM's usage in every chunk) was ignored without a word, "x" for it passed, and an
    unknown stream_options key was not logged as an unknown top-level field is."""
    monkeypatch.setattr(protocol, "_IGNORED_SEEN", set())
    stream = {**CHAT, "stream": True}
    refused = error_of(parse_chat, {**stream, "stream_options": {"continuous_usage_stats": True}})
    assert (refused.param, refused.code) == ("stream_options.continuous_usage_stats", "unsupported_value")
    mistyped = error_of(parse_completion, {"prompt": "a", "stream": True,
                                           "stream_options": {"continuous_usage_stats": "x"}})
    assert (mistyped.param, mistyped.code) == ("stream_options.continuous_usage_stats", "invalid_type")
    assert parse_chat({**stream, "stream_options": {"continuous_usage_stats": False, "include_obfuscation": True,
                                                    "include_usage": True}}).include_usage
    with caplog.at_level("WARNING", logger="fleetserve.api.protocol"):
        parse_chat({**stream, "stream_options": {"include_usage": True, "chunk_size": 4}})
    assert any("'stream_options.chunk_size'" in r.getMessage() for r in caplog.records), caplog.records


def test_completion_prompt_forms():
    assert parse_completion({"prompt": "hi"}).prompt == "hi"
    assert parse_completion({"prompt": ["hi"]}).prompt == "hi"
    assert parse_completion({"prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    assert error_of(parse_completion, {}).param == "prompt"
    assert error_of(parse_completion, {"prompt": ["a", "b"]}).param == "prompt"


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("change, param", [
    ({"tools": [TOOL]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"functions": [TOOL["function"]]}, "functions"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    # vLLM's sampling extensions and newer OpenAI fields: 200 with the answer they did not shape
    ({"top_k": 1}, "top_k"),
    ({"min_p": 0.9}, "min_p"),
    ({"repetition_penalty": 2.0}, "repetition_penalty"),
    ({"min_tokens": 5}, "min_tokens"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
    # logged once as unknown and ignored: a 200 that did not do what was asked
    ({"stop_token_ids": [2]}, "stop_token_ids"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"),
    ({"include_stop_str_in_output": True}, "include_stop_str_in_output"),
    ({"echo": True}, "echo"),  # chat's; completions honour it
    ({"continue_final_message": True}, "continue_final_message"),
    ({"add_generation_prompt": False}, "add_generation_prompt"),
    # structured outputs as vLLM 0.12+ and SGLang name them, and template extensions: answered 200 in free text
    ({"structured_outputs": {"choice": ["yes", "no"]}}, "structured_outputs"),
    ({"structural_tag": "{}"}, "structural_tag"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ({"regex": "[a-z]+"}, "regex"),
    ({"ebnf": "root ::= 'a'"}, "ebnf"),
    ({"json_schema": "{}"}, "json_schema"),
    ({"logits_processors": ["x"]}, "logits_processors"),
    ({"skip_special_tokens": False}, "skip_special_tokens"),
    ({"documents": [{"text": "d"}]}, "documents"),
])
def test_what_the_engine_cannot_honour_is_refused_not_ignored(change, param):
    """tools and JSON mode were answered 200 with plain text: a client relying on them got the wrong output."""
    err = error_of(parse_chat, {**CHAT, **change})
    assert (err.status, err.param, err.code) == (400, param, "unsupported_value")


def test_defaults_of_unsupported_parameters_and_ignorable_ones_pass():
    parse_chat({**CHAT, "tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "logit_bias": {},
                "user": "u1", "metadata": {"k": "v"}, "store": False})
    parse_completion({"model": "m", "prompt": "hi", "suffix": ""})
    parse_chat({**CHAT, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "min_tokens": 0,
                "stop_token_ids": [], "echo": False, "add_generation_prompt": True})  # vLLM's defaults
    parse_completion({"model": "m", "prompt": "hi", "echo": True, "stop_token_ids": []})
    err = error_of(parse_completion, {"model": "m", "prompt": "hi", "suffix": "tail"})
    assert (err.param, err.code) == ("suffix", "unsupported_value")


def test_a_user_message_without_content_is_400_an_assistant_one_is_not():
    err = error_of(parse_chat, {**CHAT, "messages": [{"role": "user"}]})
    assert (err.status, err.param, err.code) == (400, "messages[0].content", "missing_required_parameter")
    parse_chat({**CHAT, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
                                     {"role": "user", "content": "again"}]})


def test_error_types_are_openais_for_a_bad_key_and_an_unknown_model():
    """A bad key read `authentication_error` and an unknown model `not_found_error`; OpenAI answers both with
    `invalid_request_error` (codes invalid_api_key and model_not_found)."""
    assert APIError(401, "incorrect API key provided", code="invalid_api_key").body()["error"] == {
        "message": "incorrect API key provided", "type": "invalid_request_error", "param": None,
        "code": "invalid_api_key"}
    assert APIError(404, "no such model", param="model", code="model_not_found").body()["error"]["type"] == \
        "invalid_request_error"


@pytest.mark.parametrize("change, param, allowed", [
    ({"n": 0}, "n", "only n=1"),  # said "between 1 and 128", then n=2 was refused
    ({"n": 2}, "n", "only n=1"),
    ({"seed": 1.8446744073709552e19}, "seed", f"between {-(2**63)} and {2**64 - 1}"),  # said "must be an integer"
    ({"top_p": 1.5}, "top_p", "greater than 0.0 and at most 1.0"),  # said "between 0.0 and 1.0", then 0 was refused
    ({"top_p": 0}, "top_p", "greater than 0.0 and at most 1.0"),
    ({"response_format": {"type": "bogus"}}, "response_format", 'allowed: {"type": "text"} or omitted'),
    ({"response_format": "json"}, "response_format", 'allowed: {"type": "text"} or omitted'),
    ({"tool_choice": "bogus"}, "tool_choice", 'allowed: "none", "auto" or omitted'),
    ({"tools": [{"type": "function"}]}, "tools", "allowed: [] or omitted"),
    ({"logprobs": "yes"}, "logprobs", "must be true or false"),
    ({"top_logprobs": 3}, "top_logprobs", "allowed: logprobs false"),
])
def test_every_refusal_names_the_values_it_allows(change, param, allowed):
    err = error_of(parse_chat, {**CHAT, **change})
    assert (err.status, err.param) == (400, param)
    assert allowed in err.message and "got" in err.message


def test_a_completions_logprobs_count_is_refused_in_the_completions_apis_words():
    """It was told "allowed: logprobs false or omitted, and top_logprobs 0": chat's values, not the count's."""
    for count in (0, 3):
        err = error_of(parse_completion, {"prompt": "hi", "logprobs": count})
        assert (err.status, err.param, err.code) == (400, "logprobs", "unsupported_value")
        assert "allowed: logprobs omitted or null, got" in err.message and "top_logprobs" not in err.message
    assert "allowed: logprobs false or omitted, and top_logprobs 0" in error_of(parse_chat, {**CHAT, "logprobs": True}
                                                                                 ).message


@pytest.mark.parametrize("change, param, code", [
    ({"n": "2"}, "n", "invalid_type"),  # a wrong type is the request's error, not a refused feature
    ({"response_format": "json"}, "response_format", "invalid_type"),
    ({"logprobs": "yes"}, "logprobs", "invalid_type"),
    ({"top_logprobs": -1}, "top_logprobs", "invalid_value"),
    ({"max_tokens": 0.0}, "max_tokens", "invalid_type"),  # as 5.0 is: a float is no token count
    ({"messages": [{"content": "hi"}]}, "messages[0].role", "missing_required_parameter"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text",
     "missing_required_parameter"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0].type", "unsupported_value"),
    # each passed, or read as a refused feature, where OpenAI answers the type (found by a black-box pass)
    ({"tools": "x"}, "tools", "invalid_type"),
    ({"tool_choice": 5}, "tool_choice", "invalid_type"),
    ({"logit_bias": "x"}, "logit_bias", "invalid_type"),
    ({"n": 1.5}, "n", "invalid_type"),
    ({"max_completion_tokens": 2, "max_tokens": "x"}, "max_tokens", "invalid_type"),
    ({"store": "yes"}, "store", "invalid_type"),
    ({"parallel_tool_calls": "x"}, "parallel_tool_calls", "invalid_type"),
    ({"service_tier": 5}, "service_tier", "invalid_type"),
    ({"metadata": {"a": 1}}, "metadata", "invalid_type"),
    ({"logprobs": 0}, "logprobs", "invalid_type"),  # a boolean in chat (a count in completions)
    ({"messages": [{"role": "user", "content": "hi", "name": 5}]}, "messages[0].name", "invalid_type"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content", "invalid_value"),
])
def test_each_bad_parameter_gets_the_openai_code_that_names_what_is_wrong(change, param, code):
    err = error_of(parse_chat, {**CHAT, **change})
    assert (err.status, err.param, err.code) == (400, param, code), err.message


def test_what_was_accepted_before_the_codes_were_sharpened_still_is():
    """n=1.0 is 1; a legacy completions `logprobs` count (0-5) asks for log probabilities, even 0 (the sampled
    token's, as OpenAI and vLLM answer it: it had been answered with `logprobs: null`): refused, not a type."""
    parse_chat({**CHAT, "n": 1.0, "best_of": 1, "logprobs": False, "top_logprobs": 0})
    parse_completion({"model": "m", "prompt": "hi", "logprobs": None})
    for count in (0, 3):
        err = error_of(parse_completion, {"model": "m", "prompt": "hi", "logprobs": count})
        assert (err.param, err.code) == ("logprobs", "unsupported_value"), count
    err = error_of(parse_chat, {**CHAT, "n": 2.0})
    assert (err.param, err.code) == ("n", "unsupported_value")
    for zero in (0, -1):  # outside OpenAI's range: the request's error, as max_tokens 0 is
        err = error_of(parse_chat, {**CHAT, "n": zero})
        assert (err.param, err.code) == ("n", "invalid_value") and "at least 1" in err.message


def test_a_huge_integer_is_shown_as_what_was_read_and_an_empty_prompt_says_so():
    import orjson

    err = error_of(parse_chat, {**CHAT, **orjson.loads(b'{"max_tokens": 99999999999999999999999}')})
    assert err.param == "max_tokens" and "got a number beyond 64 bits (about 1e+23)" in err.message  # it echoed
    # 99999999999999991611392; then "got 1.84e+19" for 2**64, which read as the bound 18446744073709551615 itself
    seed = error_of(parse_chat, {**CHAT, **orjson.loads(b'{"seed": 18446744073709551616}')})
    assert seed.param == "seed" and "beyond 64 bits" in seed.message
    err = error_of(parse_completion, {"model": "m", "prompt": []})
    assert err.param == "prompt" and "must not be empty" in err.message


def test_passing_fields_of_the_wrong_type_are_refused():
    """`user: 5` was a 200; OpenAI refuses it."""
    assert error_of(parse_chat, {**CHAT, "user": 5}).param == "user"
    assert error_of(parse_chat, {**CHAT, "metadata": ["a"]}).param == "metadata"


def test_unknown_fields_pass_and_are_logged_once_per_name(caplog, monkeypatch):
    """A typo such as `max_token` generated the default length without a word; it is now logged (once, not per
    request), and not refused: clients send newer OpenAI fields and vLLM's extensions."""
    monkeypatch.setattr(protocol, "_IGNORED_SEEN", set())
    with caplog.at_level("WARNING", logger="fleetserve.api.protocol"):
        for _ in range(3):
            parse_chat({**CHAT, "max_token": 5, "spaces_between_special_tokens": True})
        parse_completion({"prompt": "hi", "max_token": 5, "echo": True})
    lines = [r.getMessage() for r in caplog.records if "ignored unknown request field" in r.getMessage()]
    assert len(lines) == 1 and "'max_token'" in lines[0] and "'spaces_between_special_tokens'" in lines[0]


def test_a_developer_message_is_the_system_prompt():
    """The template got an unknown "developer" turn and added its own default system prompt beside it."""
    parsed = parse_chat({**CHAT, "messages": [{"role": "developer", "content": "be brief"},
                                              {"role": "user", "content": "hi"}]})
    assert parsed.messages[0] == {"role": "system", "content": "be brief"}


def test_tool_calls_in_the_history_are_refused_as_tools_are():
    """The template dropped an assistant turn's tool_calls: the model answered a history it never saw."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    err = error_of(parse_chat, {**CHAT, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]})
    assert (err.param, err.code) == ("messages[1].tool_calls", "unsupported_value")
    parse_chat({**CHAT, "messages": [{"role": "assistant", "content": "x", "tool_calls": []},
                                     {"role": "user", "content": "hi"}]})


def test_the_names_remembered_for_the_ignored_fields_log_are_bounded(monkeypatch):
    """Clients choose the names: one new name per request grew the set without end."""
    monkeypatch.setattr(protocol, "_IGNORED_SEEN", set())
    for i in range(protocol.MAX_IGNORED_NAMES + 50):
        parse_chat({**CHAT, f"x{i}": 1, f"y{i}": 2})
    assert len(protocol._IGNORED_SEEN) == protocol.MAX_IGNORED_NAMES


def test_a_huge_unknown_field_name_is_kept_and_logged_cut(monkeypatch, caplog):
    """One body can hold a name of megabytes: it was remembered and logged whole."""
    monkeypatch.setattr(protocol, "_IGNORED_SEEN", set())
    with caplog.at_level("WARNING", logger="fleetserve.api.protocol"):
        parse_chat({**CHAT, "x" * 1_000_000: 1})
    assert protocol._IGNORED_SEEN == {"x" * protocol.MAX_NAME_CHARS}
    assert max(len(r.getMessage()) for r in caplog.records) < 1_000


def test_tools_with_tool_choice_none_are_answered_in_plain_text():
    """OpenAI and vLLM answer tools with tool_choice "none" without calling one; agents send it routinely, and it
    was refused (400 tools unsupported_value). A completions logprobs count out of range is a value, not a type."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    parse_chat({**CHAT, "tools": tools, "tool_choice": "none"})
    assert error_of(parse_chat, {**CHAT, "tools": tools}).param == "tools"  # "auto" (the default) would call one
    functions = [tools[0]["function"]]  # the legacy form, as the README promised it (it was refused)
    parse_chat({**CHAT, "functions": functions, "function_call": "none"})
    parse_chat({**CHAT, "functions": functions, "tool_choice": "none"})
    assert error_of(parse_chat, {**CHAT, "functions": functions, "function_call": "auto"}).param == "functions"
    conflicting = {**CHAT, "functions": functions, "function_call": "auto", "tool_choice": "none"}
    assert error_of(parse_chat, conflicting).param == "functions"  # its own choice calls one
    err = error_of(parse_completion, {"model": "m", "prompt": "hi", "logprobs": 6})
    assert (err.param, err.code) == ("logprobs", "invalid_value")


def test_an_unknown_model_name_is_not_echoed_whole():
    from fleetserve.api.errors import model_not_found

    err = model_not_found("x" * 100_000, ["m"])
    assert len(err.message) < 400 and "100,000 characters" in err.message


def test_chat_template_kwargs_reach_the_template_but_never_the_engines_own_arguments():
    """Qwen's clients send {"enable_thinking": false} by default: honoured, as vLLM does. What the engine sets
    itself (the conversation, the generation prompt, tokenizing) is no template variable."""
    parsed = parse_chat({**CHAT, "chat_template_kwargs": {"enable_thinking": False}})
    assert parsed.template_kwargs == {"enable_thinking": False}
    assert parse_chat(CHAT).template_kwargs == {}
    for bad, code in (({"add_generation_prompt": False}, "unsupported_value"), ({"raise_exception": "x"},
                      "unsupported_value"), ([1], "invalid_type")):
        err = error_of(parse_chat, {**CHAT, "chat_template_kwargs": bad})
        assert (err.param, err.code) == ("chat_template_kwargs", code), err.message


def test_openais_own_rules_for_tool_choice_tool_messages_and_refusals():
    """Found by a conformance pass: tool_choice "auto" without tools and a tool message without tool_call_id were
    answered 200 (OpenAI and vLLM refuse both), and an assistant turn with OpenAI's refusal part, replayed, was
    refused."""
    err = error_of(parse_chat, {**CHAT, "tool_choice": "auto"})
    assert (err.param, err.code) == ("tool_choice", "invalid_value") and "only allowed when tools" in err.message
    parse_chat({**CHAT, "tool_choice": "none"})
    tool = {"role": "tool", "content": "42"}
    err = error_of(parse_chat, {**CHAT, "messages": [{"role": "user", "content": "hi"}, tool]})
    assert (err.param, err.code) == ("messages[1].tool_call_id", "missing_required_parameter")
    err = error_of(parse_chat, {**CHAT, "messages": [{"role": "user", "content": "hi"}, {**tool, "tool_call_id": 7}]})
    assert (err.param, err.code) == ("messages[1].tool_call_id", "invalid_type")
    parse_chat({**CHAT, "messages": [{"role": "user", "content": "hi"}, {**tool, "tool_call_id": "c1"}]})
    replayed = parse_chat({**CHAT, "messages": [
        {"role": "user", "content": "how?"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]},
        {"role": "user", "content": "ok"}]})
    assert replayed.messages[1] == {"role": "assistant", "content": "I can't help with that."}
    err = error_of(parse_chat, {**CHAT, "messages": [{"role": "user", "content": [{"type": "refusal",
                                                                                   "refusal": "no"}]}]})
    assert (err.param, err.code) == ("messages[0].content[0].type", "unsupported_value")
