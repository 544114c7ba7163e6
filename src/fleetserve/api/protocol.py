"""Parse and check OpenAI request bodies; every rejection names the parameter and what is allowed."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import orjson

from fleetserve.api.errors import APIError, invalid

ROLES = ("system", "developer", "user", "assistant", "tool")
log = logging.getLogger(__name__)
# the OpenAI paths that generate: what the router proxies by POST, salts, asks usage of and counts
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
MAX_STOP_SEQUENCES = 4
# Integer bounds at the API boundary: nothing unbounded reaches torch (whose seeds are 64-bit) or the scheduler.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
MAX_TOKENS_LIMIT = 2**31 - 1
TOKEN_ID_LIMIT = 2**31 - 1
# Sampling runs in float32: a top_p that rounds to 0 there keeps no token, and logits divided by a temperature
# this small overflow to inf (softmax gives NaN). Both limits keep the meaning: top-1 and greedy respectively.
TOP_P_FLOOR = 1.1754943508222875e-38  # float32's smallest normal number; any top_p below it means top-1
GREEDY_BELOW_TEMPERATURE = 1e-6


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False  # vLLM's extension: generate exactly max_tokens (benchmarks, tests)
    max_tokens_param: str = "max_tokens"  # the field that gave max_tokens: errors name what the client sent


@dataclass(frozen=True)
class ParsedRequest:
    """What the engine needs from a chat or completion request."""

    kind: str  # "chat" or "completion"
    model: str | None
    stream: bool
    include_usage: bool
    sampling: SamplingParams
    messages: list[dict[str, str]] = field(default_factory=list)
    prompt: str | list[int] | None = None
    echo: bool = False
    cache_salt: str | None = None
    template_kwargs: dict = field(default_factory=dict)  # chat_template_kwargs: more variables for the template


TOO_DEEP = "request body is nested too deeply: arrays and objects at most about 1,000 levels deep"


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object. orjson is the fast path (the gateway parses every request once); the stdlib
    parser reads what orjson refuses (NaN, lone surrogates), so what is accepted, and which field a later check
    names, does not depend on the parser. orjson reads an integer past 64 bits as a float: the integer checks
    refuse it, naming their range."""
    if not raw:
        raise APIError(400, "request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc).lower():  # the stdlib parser would recurse until a RecursionError: a 500
            raise APIError(400, TOO_DEEP, code="invalid_json") from None
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
        except ValueError:  # an integer of more digits than Python converts (4,300): it had been a 500
            raise APIError(400, "request body has a number too long to read (more than 4,300 digits)",
                           code="invalid_json") from None
        except RecursionError:
            raise APIError(400, TOO_DEEP, code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    return body


def _number(body: dict, name: str, lo: float, hi: float, default: float, *, above_lo: bool = False) -> float:
    """`above_lo`: `lo` itself is refused (top_p 0 keeps no token), and the message says so."""
    value = body.get(name)
    if value is None:
        return default
    allowed = f"greater than {lo} and at most {hi}" if above_lo else f"between {lo} and {hi}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(name, f"must be a number {allowed}, got {json.dumps(value)[:80]}", "invalid_type")
    if not lo <= value <= hi or (above_lo and value == lo):
        raise invalid(name, f"must be {allowed}, got {value}")
    return float(value)


def _int(body: dict, name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer() and abs(value) >= 2 ** 63:  # an integer past 64 bits, which
        # orjson reads as a float: its digits are not all there (99999999999999999999999 read 99999999999999991611392)
        # (a rounded figure read as the bound itself: "got 1.84e+19" against 18446744073709551615)
        raise invalid(name, f"must be between {lo} and {hi}, got a number beyond 64 bits (about {value:.3g})")
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, f"must be an integer between {lo} and {hi}, got {json.dumps(value)[:80]}", "invalid_type")
    if not lo <= value <= hi:
        raise invalid(name, f"must be between {lo} and {hi}, got {str(value)[:80]}")
    return value


def _bool(body: dict, name: str, default: bool = False, where: str | None = None) -> bool:
    """`where`: the parameter's full name when `body` is a nested object (stream_options.include_usage)."""
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(where or name, f"must be true or false, got {json.dumps(value)[:80]}", "invalid_type")
    return value


def _utf8(text: str, where: str) -> str:
    """JSON may carry lone surrogates ("\\ud800") that no tokenizer or UTF-8 response can hold: reject them here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid(where, f"contains a character that is not valid Unicode text at position {exc.start} "
                             "(a lone surrogate); send UTF-8 text") from None
    return text


def _stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise invalid("stop", "must be a string or a list of strings", "invalid_type")
    if len(value) > MAX_STOP_SEQUENCES:
        raise invalid("stop", f"at most {MAX_STOP_SEQUENCES} sequences, got {len(value)}")
    if any(s == "" for s in value):
        raise invalid("stop", "stop sequences must not be empty")
    return tuple(_utf8(s, "stop") for s in value)


def _sampling(body: dict) -> SamplingParams:
    max_tokens, max_tokens_param = _int(body, "max_completion_tokens", 1, MAX_TOKENS_LIMIT), "max_completion_tokens"
    legacy = _int(body, "max_tokens", 1, MAX_TOKENS_LIMIT)  # checked either way: "x" beside the other had passed
    if max_tokens is None:
        max_tokens, max_tokens_param = legacy, "max_tokens"
    for name in ("n", "best_of"):  # one choice per request: any other count is refused
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or
                                  (isinstance(value, float) and not value.is_integer())):  # "2", 1.5: a bad type
            raise invalid(name, f"must be an integer (only {name}=1 is supported by this engine), got "
                                f"{json.dumps(value)[:80]}", "invalid_type")
        if value is not None and value < 1:  # outside OpenAI's range: the request's error, not a refusal
            raise invalid(name, f"must be at least 1 (only {name}=1 is supported by this engine), got "
                                f"{json.dumps(body[name])[:80]}")
        if value not in (None, 1):  # 1.0 is 1, as it always was
            raise invalid(name, f"only {name}=1 is supported by this engine, got {json.dumps(body[name])[:80]}",
                          "unsupported_value")
    # OpenAI's types first: "yes" or -1 is an error of the request, not a refusal. `logprobs` is a boolean in chat
    # and a count (0-5) in the legacy completions API, where even 0 asks for the sampled token's (OpenAI's "up to
    # logprobs+1 elements", as vLLM answers it): it had been answered with `logprobs: null`
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool) and not (isinstance(logprobs, int) and
                                                                          0 <= logprobs <= 5):
        raise invalid("logprobs", f"must be true or false (chat), or a count from 0 to 5 (completions), got "
                                  f"{json.dumps(logprobs)[:80]}", "invalid_value" if isinstance(logprobs, int)
                      else "invalid_type")
    _int(body, "top_logprobs", 0, 20)
    asked = not (logprobs is None or logprobs is False)
    if asked or body.get("top_logprobs") not in (None, 0):
        name = "logprobs" if asked else "top_logprobs"
        # a count is the completions API's (where even 0 asks for one): there it is omitted or null, and it has no
        # top_logprobs; chat's boolean is false or omitted, beside top_logprobs 0
        allowed = "logprobs omitted or null" if asked and not isinstance(logprobs, bool) else \
            "logprobs false or omitted, and top_logprobs 0"
        raise invalid(name, f"log probabilities are not supported by this engine; allowed: {allowed}, got "
                            f"{json.dumps(body[name])[:80]}", "unsupported_value")
    top_p = _number(body, "top_p", 0.0, 1.0, 1.0, above_lo=True)
    temperature = _number(body, "temperature", 0.0, 2.0, 1.0)
    return SamplingParams(
        max_tokens=max_tokens,
        max_tokens_param=max_tokens_param,
        temperature=0.0 if temperature < GREEDY_BELOW_TEMPERATURE else temperature,
        top_p=max(top_p, TOP_P_FLOOR),
        stop=_stop(body),
        seed=_int(body, "seed", SEED_MIN, SEED_MAX),
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0, 0.0),
        ignore_eos=_bool(body, "ignore_eos"),
    )


# OpenAI parameters that change what the answer is or how it is shaped, which this engine cannot honour: each is a
# 400 `unsupported_value` when it asks for anything but the default (a client relying on JSON mode or a tool call
# got plain text and a 200). Parameters that change nothing here (user, metadata, store, service_tier) pass.
_UNSUPPORTED = {  # name: (why, the values allowed, the test of a value)
    "tools": ("tool calls are not supported by this engine", "[] or omitted", lambda v: v in (None, [])),
    "functions": ("function calls are not supported by this engine", "[] or omitted", lambda v: v in (None, [])),
    "tool_choice": ("tool calls are not supported by this engine", '"none", "auto" or omitted',
                    lambda v: v in (None, "none", "auto")),
    "function_call": ("function calls are not supported by this engine", '"none", "auto" or omitted',
                      lambda v: v in (None, "none", "auto")),
    "response_format": ("JSON mode and structured outputs are not supported by this engine",
                        '{"type": "text"} or omitted', lambda v: v is None or v == {"type": "text"}),
    "logit_bias": ("logit_bias is not supported by this engine", "{} or omitted", lambda v: v in (None, {})),
    "suffix": ("suffix (insertion) is not supported by this engine", '"" or omitted', lambda v: v in (None, "")),
    "modalities": ("only text output is supported", '["text"] or omitted', lambda v: v in (None, ["text"])),
    "audio": ("only text output is supported", "omitted", lambda v: v is None),
    "prediction": ("predicted outputs are not supported by this engine", "omitted", lambda v: v is None),
    "web_search_options": ("web search is not supported by this engine", "omitted", lambda v: v is None),
    # vLLM's sampling extensions, which a client moved from vLLM sends: ignored, they changed the answer silently
    "top_k": ("top_k is not supported by this engine (top_p is)", "-1, 0 or omitted",
              lambda v: v is None or (not isinstance(v, bool) and v in (-1, 0))),
    "min_p": ("min_p is not supported by this engine (top_p is)", "0 or omitted", lambda v: v in (None, 0)),
    "repetition_penalty": ("repetition_penalty is not supported by this engine (presence_penalty and "
                           "frequency_penalty are)", "1 or omitted", lambda v: v in (None, 1)),
    "min_tokens": ("min_tokens is not supported by this engine", "0 or omitted", lambda v: v in (None, 0)),
    "use_beam_search": ("beam search is not supported by this engine", "false or omitted",
                        lambda v: v in (None, False)),
    "guided_json": ("guided decoding is not supported by this engine", "omitted", lambda v: v is None),
    "guided_regex": ("guided decoding is not supported by this engine", "omitted", lambda v: v is None),
    "guided_choice": ("guided decoding is not supported by this engine", "omitted", lambda v: v is None),
    "guided_grammar": ("guided decoding is not supported by this engine", "omitted", lambda v: v is None),
    # more of vLLM's, each changing the answer: they were logged once as unknown and ignored, a 200 that did not do
    # what was asked
    "stop_token_ids": ("stop_token_ids is not supported by this engine (stop strings are)", "[] or omitted",
                       lambda v: v in (None, [])),
    "prompt_logprobs": ("prompt_logprobs is not supported by this engine", "omitted", lambda v: v is None),
    "include_stop_str_in_output": ("include_stop_str_in_output is not supported by this engine", "false or omitted",
                                   lambda v: v in (None, False)),
    "allowed_token_ids": ("allowed_token_ids is not supported by this engine", "omitted", lambda v: v is None),
    "bad_words": ("bad_words is not supported by this engine", "[] or omitted", lambda v: v in (None, [])),
    "truncate_prompt_tokens": ("truncate_prompt_tokens is not supported by this engine", "omitted",
                               lambda v: v is None),
    # structured outputs as vLLM (0.12 and later: `structured_outputs` replaced the guided_* fields) and SGLang
    # name them: a client moved from either asked for constrained text and got free text, answered 200
    "structured_outputs": ("structured outputs are not supported by this engine", "omitted", lambda v: v is None),
    "structural_tag": ("structured outputs are not supported by this engine", "omitted", lambda v: v is None),
    "guided_whitespace_pattern": ("guided decoding is not supported by this engine", "omitted", lambda v: v is None),
    "guided_decoding_backend": ("guided decoding is not supported by this engine", "omitted", lambda v: v is None),
    "regex": ("constrained decoding (SGLang's regex) is not supported by this engine", "omitted",
              lambda v: v is None),
    "ebnf": ("constrained decoding (SGLang's ebnf) is not supported by this engine", "omitted", lambda v: v is None),
    "json_schema": ("constrained decoding (SGLang's json_schema) is not supported by this engine", "omitted",
                    lambda v: v is None),
    "logits_processors": ("logits_processors are not supported by this engine", "omitted", lambda v: v is None),
    "skip_special_tokens": ("special tokens are always left out of the text here", "true or omitted",
                            lambda v: v in (None, True)),
}
# the same for chat alone (vLLM's chat extensions; `echo` is a completions parameter, honoured there)
_UNSUPPORTED_CHAT = {
    "echo": ("echo is not supported in chat completions (it is in /v1/completions)", "false or omitted",
             lambda v: v in (None, False)),
    "continue_final_message": ("continue_final_message is not supported by this engine", "false or omitted",
                               lambda v: v in (None, False)),
    "add_generation_prompt": ("add_generation_prompt is not supported by this engine (the assistant's turn is "
                              "always opened)", "true or omitted", lambda v: v in (None, True)),
    "chat_template": ("chat_template is not supported by this engine (the model's own template is used)", "omitted",
                      lambda v: v is None),
    "documents": ("documents for the chat template are not supported by this engine", "[] or omitted",
                  lambda v: v in (None, [])),
}
# Parameters that change nothing here and pass without a word; any other name is logged once as ignored (a typo
# such as "max_token" otherwise generated the default length unsaid), not refused: clients send newer OpenAI
# fields and vLLM's extensions, and a 400 for each would break them.
_COMMON = frozenset({
    "model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n", "best_of", "logprobs",
    "top_logprobs", "top_p", "temperature", "stop", "seed", "presence_penalty", "frequency_penalty", "ignore_eos",
    "cache_salt", "user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key",
    "safety_identifier", *_UNSUPPORTED})
_KNOWN = {"chat": _COMMON | {"messages", "chat_template_kwargs", *_UNSUPPORTED_CHAT},
          "completion": _COMMON | {"prompt", "echo"}}
_IGNORED_SEEN: set[str] = set()
MAX_IGNORED_NAMES = 256
MAX_NAME_CHARS = 64


def _unsupported(body: dict, kind: str) -> None:
    if body.get("response_format") is not None and not isinstance(body["response_format"], dict):
        raise invalid("response_format", 'must be an object; allowed: {"type": "text"} or omitted, got '
                                         f"{json.dumps(body['response_format'])[:80]}", "invalid_type")
    for name, types, what in (("tools", list, "an array"), ("functions", list, "an array"),
                              ("tool_choice", str | dict, "a string or an object"),
                              ("function_call", str | dict, "a string or an object"),
                              ("logit_bias", dict, "an object")):
        if body.get(name) is not None and not isinstance(body[name], types):  # a bad type before a refusal
            raise invalid(name, f"must be {what}, got {json.dumps(body[name])[:80]}", "invalid_type")
    if kind == "chat" and body.get("logprobs") is not None and not isinstance(body["logprobs"], bool):
        raise invalid("logprobs", f"must be true or false in chat completions, got {json.dumps(body['logprobs'])[:80]}",
                      "invalid_type")
    refused = {**_UNSUPPORTED, **_UNSUPPORTED_CHAT} if kind == "chat" else _UNSUPPORTED
    if body.get("tool_choice") == "none" and isinstance(body.get("tools"), list):
        # no tool is called, as OpenAI and vLLM answer it: in plain text (agents send their tools with "none")
        refused = {k: v for k, v in refused.items() if k != "tools"}
    legacy = body.get("function_call", body.get("tool_choice"))  # the legacy form's own choice first
    if legacy == "none" and isinstance(body.get("functions"), list):
        refused = {k: v for k, v in refused.items() if k != "functions"}  # the legacy form of the same
    for name, (why, allowed, default) in refused.items():
        if name in body and not default(body[name]):
            raise invalid(name, f"{why}; allowed: {allowed}, got {json.dumps(body[name])[:80]}",
                          "unsupported_value")
    if body.get("tool_choice") == "auto" and not body.get("tools") and not body.get("functions"):
        # as OpenAI and vLLM answer it: a choice among no tools is a client's mistake (it had passed)
        raise invalid("tool_choice", 'is only allowed when tools are given; allowed without tools: "none" or '
                                     'omitted, got "auto"')
    for name in ("user", "safety_identifier", "prompt_cache_key", "service_tier"):  # strings in OpenAI's API
        if body.get(name) is not None and not isinstance(body[name], str):
            raise invalid(name, f"must be a string, got {json.dumps(body[name])[:80]}", "invalid_type")
    for name in ("store", "parallel_tool_calls"):  # booleans in OpenAI's API ("yes" had passed)
        _bool(body, name)
    metadata = body.get("metadata")
    if metadata is not None and (not isinstance(metadata, dict) or
                                 not all(isinstance(v, str) for v in metadata.values())):
        raise invalid("metadata", "must be an object of string keys and values", "invalid_type")


def _note_ignored(body: dict, kind: str, known: frozenset[str] | None = None, prefix: str = "") -> None:
    """Log, once per process and name, a request field this endpoint does not know and so ignores (`known`, under
    `prefix`: an object's own fields); at most `MAX_IGNORED_NAMES` names are remembered (clients choose them: an
    unbounded set was a slow memory leak)."""
    if len(_IGNORED_SEEN) >= MAX_IGNORED_NAMES:
        return
    known = _KNOWN[kind] if known is None else known
    # cut to MAX_NAME_CHARS: a name of megabytes (one body holds it) was kept and logged whole
    unknown = list(dict.fromkeys(prefix + name[:MAX_NAME_CHARS] for name in body if name not in known))
    unknown = [name for name in unknown if name not in _IGNORED_SEEN]
    if unknown:
        unknown = unknown[:MAX_IGNORED_NAMES - len(_IGNORED_SEEN)]
        _IGNORED_SEEN.update(unknown)
        if len(_IGNORED_SEEN) >= MAX_IGNORED_NAMES:
            log.warning("%d unknown request field names logged: further ones are ignored without a log line",
                        MAX_IGNORED_NAMES)
        log.warning("ignored unknown request field(s) %s in /v1/%s (logged once per name)",
                    ", ".join(map(repr, unknown[:10])), "chat/completions" if kind == "chat" else "completions")


def _content_text(content: Any, where: str, assistant: bool = False) -> str:
    """A message's text; an assistant's refusal parts are its text too (a conversation replayed with OpenAI's
    refusal in it was a 400)."""
    if isinstance(content, str):
        return _utf8(content, where)
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise invalid(f"{where}[{i}]", "must be an object such as {'type': 'text', 'text': ...}",
                              "invalid_type")
            key = "refusal" if assistant and part.get("type") == "refusal" else "text"
            if part.get("type") != key:
                served = "text content parts (and refusal parts in an assistant message)" if assistant else \
                    "text content parts"
                raise invalid(f"{where}[{i}].type", f"only {served} are supported, got "
                                                   f"{json.dumps(part.get('type'))[:80]}", "unsupported_value")
            if key not in part:
                raise invalid(f"{where}[{i}].{key}", f"is required for a {key} part", "missing_required_parameter")
            if not isinstance(part[key], str):
                raise invalid(f"{where}[{i}].{key}", "must be a string", "invalid_type")
            parts.append(_utf8(part[key], f"{where}[{i}].{key}"))
        return "".join(parts)
    if content is None:
        return ""
    raise invalid(where, "must be a string or a list of text parts", "invalid_type")


def _messages(body: dict, tool_calls: bool = False) -> list[dict[str, str]]:
    if "messages" not in body:
        raise invalid("messages", "is required", "missing_required_parameter")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "must be a non-empty array of {role, content} objects", "invalid_type")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise invalid(f"messages[{i}]", "must be an object with role and content", "invalid_type")
        role = msg.get("role")
        if role is None:
            raise invalid(f"messages[{i}].role", f"is required; allowed values: {', '.join(ROLES)}",
                          "missing_required_parameter")
        if role not in ROLES:
            raise invalid(f"messages[{i}].role", f"got {json.dumps(role)}; allowed values: {', '.join(ROLES)}")
        if msg.get("content") is None and role in ("system", "developer", "user"):
            raise invalid(f"messages[{i}].content", f"is required for a {role} message", "missing_required_parameter")
        if msg.get("content") == [] and role in ("system", "developer", "user"):
            raise invalid(f"messages[{i}].content", "must not be an empty array: a string, or at least one text part")
        if msg.get("name") is not None and not isinstance(msg["name"], str):
            raise invalid(f"messages[{i}].name", f"must be a string, got {json.dumps(msg['name'])[:80]}",
                          "invalid_type")
        if role == "tool" and not isinstance(msg.get("tool_call_id"), str):  # OpenAI's 400: the call it answers
            raise invalid(f"messages[{i}].tool_call_id", "is required for a tool message (a string)",
                          "missing_required_parameter" if msg.get("tool_call_id") is None else "invalid_type")
        for name in ("tool_calls", "function_call"):  # the template would drop them: the model never saw the call
            if not tool_calls and msg.get(name) not in (None, []):
                raise invalid(f"messages[{i}].{name}", "tool and function calls are not supported by this engine; "
                              "allowed: [] or omitted", "unsupported_value")
        # OpenAI's developer message is the system prompt of newer models; chat templates know only "system"
        # (SmolLM2's added its own default system prompt and an unknown "developer" turn)
        out.append({"role": "system" if role == "developer" else role,
                    "content": _content_text(msg.get("content"), f"messages[{i}].content", role == "assistant")})
    return out


def _prompt(body: dict) -> str | list[int]:
    if "prompt" not in body:
        raise invalid("prompt", "is required", "missing_required_parameter")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _utf8(prompt, "prompt")
    if prompt == []:
        raise invalid("prompt", "must not be empty: a string, or an array of at least one token id")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = next((t for t in prompt if not 0 <= t <= TOKEN_ID_LIMIT), None)
        if bad is not None:
            raise invalid("prompt", f"token ids must be between 0 and {TOKEN_ID_LIMIT}, got {str(bad)[:80]}")
        return prompt
    raise invalid("prompt", "must be a string or one array of token ids (batches of prompts are not supported)",
                  "invalid_type")


def _model(body: dict) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("model", "must be a string", "invalid_type")
    return model


STREAM_OPTIONS = frozenset({"include_usage", "include_obfuscation", "continuous_usage_stats"})


def _stream_options(body: dict, stream: bool, kind: str) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise invalid("stream_options", "must be an object", "invalid_type")
    if not stream:
        raise invalid("stream_options", "is only allowed when stream is true")
    # OpenAI's obfuscation pads chunks against side channels: none here to pad, so taking it changes nothing
    _bool(options, "include_obfuscation", where="stream_options.include_obfuscation")
    if _bool(options, "continuous_usage_stats", where="stream_options.continuous_usage_stats"):
        raise invalid("stream_options.continuous_usage_stats", "usage in every chunk (vLLM's extension) is not "
                      "supported; allowed: false or omitted (include_usage gives it in the last chunk)",
                      "unsupported_value")  # it had been ignored without a word
    _note_ignored(options, kind, STREAM_OPTIONS, "stream_options.")
    return _bool(options, "include_usage", where="stream_options.include_usage")


def cache_salt_of(body: dict) -> str | None:
    """The client's `cache_salt`: a non-empty string, or None; anything else is a 400 naming the field."""
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise invalid("cache_salt", "must be a non-empty string", "invalid_type")
    return _utf8(salt, "cache_salt") if salt is not None else None


def parse_chat(body: dict, *, tool_calls: bool = False) -> ParsedRequest:
    """`tool_calls`: an assistant turn's tool calls pass (a trace log replayed against vLLM or SGLang, which
    render them); the built-in engines refuse them, as they refuse `tools`."""
    _unsupported(body, "chat")
    _note_ignored(body, "chat")
    stream = _bool(body, "stream")
    return ParsedRequest(
        kind="chat",
        model=_model(body),
        stream=stream,
        include_usage=_stream_options(body, stream, "chat"),
        sampling=_sampling(body),
        messages=_messages(body, tool_calls),
        cache_salt=cache_salt_of(body),
        template_kwargs=_template_kwargs(body),
    )


# what the engine itself gives apply_chat_template, and the functions the template environment defines (a string
# in place of raise_exception made a refused conversation a 500): a request's chat_template_kwargs may not set them
TEMPLATE_OWN = frozenset({"conversation", "messages", "add_generation_prompt", "continue_final_message", "tokenize",
                          "chat_template", "tools", "documents", "return_dict", "return_tensors", "padding",
                          "truncation", "max_length", "tokenizer_kwargs", "return_assistant_tokens_mask",
                          "raise_exception", "strftime_now"})


def _template_kwargs(body: dict) -> dict:
    """vLLM's `chat_template_kwargs` (Qwen's clients send `{"enable_thinking": false}` by default): variables the
    model's template reads, as vLLM passes them; refused (400) for a while, they are honoured now."""
    given = body.get("chat_template_kwargs")
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise invalid("chat_template_kwargs", f"must be an object, got {json.dumps(given)[:80]}", "invalid_type")
    own = sorted(TEMPLATE_OWN & set(given))
    if own:
        raise invalid("chat_template_kwargs", f"{', '.join(own)} {'is' if len(own) == 1 else 'are'} the engine's to "
                      f"set, not a template variable; allowed: any other name", "unsupported_value")
    return given


def parse_completion(body: dict) -> ParsedRequest:
    _unsupported(body, "completion")
    _note_ignored(body, "completion")
    stream = _bool(body, "stream")
    return ParsedRequest(
        kind="completion",
        model=_model(body),
        stream=stream,
        include_usage=_stream_options(body, stream, "completion"),
        sampling=_sampling(body),
        prompt=_prompt(body),
        echo=_bool(body, "echo"),
        cache_salt=cache_salt_of(body),
    )


def parse_generation(path: str, body: dict) -> ParsedRequest:
    """The body of a generation path (GENERATION_PATHS) as the built-in engines read it: a 400 naming the field."""
    return parse_chat(body) if path == "/v1/chat/completions" else parse_completion(body)
