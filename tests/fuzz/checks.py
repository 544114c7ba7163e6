"""Checks every fuzzed response must pass, beyond schemathesis's own: errors in OpenAI JSON, naming the field."""

from __future__ import annotations

import json
import re
from collections import Counter

# 400 codes for which the whole body, not one parameter, is at fault.
WHOLE_BODY_CODES = {"invalid_json", "request_too_large"}


# (base URL, operation, status) of every fuzzed response: proves the fuzzers reached both validation and generation.
SEEN: Counter = Counter()


class NotOpenAIError(AssertionError):
    pass


def _error_object(body: object, where: str) -> dict:
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        raise NotOpenAIError(f"{where}: not {{'error': {{...}}}}: {str(body)[:300]}")
    err = body["error"]
    missing = {"message", "type", "param", "code"} - set(err)
    if missing:
        raise NotOpenAIError(f"{where}: error lacks {sorted(missing)}: {err}")
    if not isinstance(err["message"], str) or not err["message"] or not isinstance(err["type"], str):
        raise NotOpenAIError(f"{where}: message and type must be non-empty strings: {err}")
    for key in ("param", "code"):
        if err[key] is not None and not isinstance(err[key], str):
            raise NotOpenAIError(f"{where}: {key} must be a string or null: {err}")
    return err


def _param_root(param: str) -> str:
    return param.split("[", 1)[0].split(".", 1)[0]


def openai_errors(ctx, response, case) -> bool | None:
    """Every non-2xx is OpenAI error JSON; a 400 about a parameter names one the operation has; streams that
    started (200) carry no error event (validation must happen before the first byte)."""
    status = response.status_code
    SEEN[(re.split(r"/v1/|/health|/metrics|/invocations", response.request.url)[0], case.operation.label,
          status)] += 1
    content_type = response.headers.get("content-type", [""])
    content_type = content_type[0] if isinstance(content_type, list) else content_type
    text = response.content.decode("utf-8", errors="replace")
    if status >= 300:
        try:
            body = json.loads(text)
        except ValueError:
            raise NotOpenAIError(f"{status} with a non-JSON body: {text[:300]!r}") from None
        err = _error_object(body, f"{status} body")
        if status == 400 and err["code"] not in WHOLE_BODY_CODES:
            param = err["param"]
            if not param:
                raise NotOpenAIError(f"400 does not name the parameter at fault: {err}")
            # a parameter the schema declares, or one the request itself sent: a field the engine refuses by name
            # (chat's `prediction` in a completions body) is rightly named, whether or not the schema lists it
            sent = set(case.body) if isinstance(case.body, dict) else set()
            known = _body_properties(case)
            if known and _param_root(param) not in known | sent:
                raise NotOpenAIError(f"400 names {param!r}, which is no parameter of {case.operation.label}: {err}")
        return None
    if content_type.startswith("text/event-stream"):
        for line in text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                if isinstance(event, dict) and "error" in event:
                    raise NotOpenAIError(f"a started stream carries an error event: {event}")
    return None


def _body_properties(case) -> set[str]:
    """The request parameters the operation declares (empty for operations without a body); for a body of one
    of several schemas (/invocations: chat or completions), the parameters of any of them."""
    body = case.operation.definition.raw.get("requestBody")
    if not body:
        return set()
    schema = body["content"]["application/json"]["schema"]
    schemas = case.operation.schema.raw_schema["components"]["schemas"]
    refs = [one["$ref"] for one in schema["oneOf"]] if "oneOf" in schema else [schema["$ref"]]
    return {name for ref in refs for name in schemas[ref.rsplit("/", 1)[1]]["properties"]}
