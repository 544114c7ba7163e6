"""The OpenAPI 3.1 document of the OpenAI-compatible surface, served at /openapi.json by the router and engines.

Why it exists: clients and fuzzers (tests/fuzz runs schemathesis against it) need a machine-readable contract,
and that contract must say what `api.protocol` really accepts. The bounds below are imported from there, so a
change to a limit changes the document too. Every error is the OpenAI shape from `api.errors`.

The router's admin API (/admin/*) is deliberately left out: it is for the fleet, not for clients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse

from fleetserve.api.protocol import MAX_STOP_SEQUENCES, MAX_TOKENS_LIMIT, ROLES, SEED_MAX, SEED_MIN, TOKEN_ID_LIMIT

Variant = Literal["engine", "router"]
_REF = "#/components/schemas/"


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """`null` means "not given" to api.protocol for every optional parameter."""
    return {"anyOf": [schema, {"type": "null"}]}


def _number(lo: float, hi: float, description: str) -> dict[str, Any]:
    return _nullable({"type": "number", "minimum": lo, "maximum": hi, "description": description})


def _max_tokens(description: str) -> dict[str, Any]:
    return _nullable({"type": "integer", "minimum": 1, "maximum": MAX_TOKENS_LIMIT, "description": description})


def _sampling_properties() -> dict[str, Any]:
    """Parameters that chat and completions share (api.protocol._sampling and friends)."""
    return {
        "stream": _nullable({"type": "boolean"}),
        "stream_options": _nullable({
            "type": "object",
            "description": "only with stream: true",
            "properties": {"include_usage": _nullable({"type": "boolean"})},
        }),
        "max_tokens": _max_tokens("tokens to generate at most; prompt + max_tokens must fit the context"),
        "max_completion_tokens": _max_tokens("same as max_tokens; takes precedence"),
        "temperature": _number(0.0, 2.0, "0 is greedy"),
        "top_p": _nullable({"type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0}),
        "n": _nullable({"type": "integer", "minimum": 1, "maximum": 1, "description": "only 1 is supported"}),
        "best_of": _nullable({"type": "integer", "minimum": 1, "maximum": 1, "description": "only 1 is supported"}),
        "logprobs": _nullable({"enum": [False], "description": "log probabilities are not supported"}),
        "top_logprobs": _nullable({"enum": [0, False]}),  # api.protocol compares with ==: false is 0
        "stop": _nullable({"anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": MAX_STOP_SEQUENCES},
        ]}),
        "seed": _nullable({"type": "integer", "minimum": SEED_MIN, "maximum": SEED_MAX}),
        "presence_penalty": _number(-2.0, 2.0, "OpenAI's presence penalty"),
        "frequency_penalty": _number(-2.0, 2.0, "OpenAI's frequency penalty"),
        "ignore_eos": _nullable({"type": "boolean", "description": "vLLM's extension: generate exactly max_tokens"}),
        "cache_salt": _nullable({"type": "string", "minLength": 1,
                                 "description": "separates this client's cached prefixes from everyone else's"}),
    }


def _model_property(models: Sequence[str]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "description": "the served model name (GET /v1/models)"}
    if models:
        schema["enum"] = list(models)
    return _nullable(schema)


def _schemas(models: Sequence[str]) -> dict[str, Any]:
    text_part = {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    }
    message = {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"enum": list(ROLES)},
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"$ref": _REF + "TextPart"}},
                                  {"type": "null"}]},
        },
    }
    token_ids = {"type": "array", "minItems": 1,
                 "items": {"type": "integer", "minimum": 0, "maximum": TOKEN_ID_LIMIT}}
    prompt = {"anyOf": [
        {"type": "string"},
        token_ids,
        {"type": "array", "minItems": 1, "maxItems": 1, "items": {"anyOf": [{"type": "string"}, token_ids]},
         "description": "a batch of exactly one prompt"},
    ]}
    usage = {"type": "object", "properties": {"prompt_tokens": {"type": "integer"},
                                              "completion_tokens": {"type": "integer"},
                                              "total_tokens": {"type": "integer"}}}
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"], "description": "the request field at fault"},
                    "code": {"type": ["string", "null"]},
                },
            }},
        },
        "ServerSentEvent": {
            "type": "object",
            "description": "one event: a JSON chunk, a final {error: ...} if generation failed, then [DONE]",
            "properties": {"data": {"type": "string"}},
        },
        "TextPart": text_part,
        "Message": message,
        "ChatCompletionRequest": {
            "type": "object",
            "required": ["messages"],
            "properties": {
                "model": _model_property(models),
                "messages": {"type": "array", "minItems": 1, "items": {"$ref": _REF + "Message"}},
                **_sampling_properties(),
            },
        },
        "CompletionRequest": {
            "type": "object",
            "required": ["prompt"],
            "properties": {
                "model": _model_property(models),
                "prompt": prompt,
                "echo": _nullable({"type": "boolean"}),
                **_sampling_properties(),
            },
        },
        "ChatCompletion": {
            "type": "object",
            "required": ["id", "object", "choices"],
            "properties": {"id": {"type": "string"}, "object": {"const": "chat.completion"},
                           "model": {"type": "string"}, "created": {"type": "integer"},
                           "choices": {"type": "array"}, "usage": usage},
        },
        "Completion": {
            "type": "object",
            "required": ["id", "object", "choices"],
            "properties": {"id": {"type": "string"}, "object": {"const": "text_completion"},
                           "model": {"type": "string"}, "created": {"type": "integer"},
                           "choices": {"type": "array"}, "usage": usage},
        },
        "Model": {
            "type": "object",
            "required": ["id", "object"],
            "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                           "owned_by": {"type": "string"}},
        },
        "ModelList": {
            "type": "object",
            "required": ["object", "data"],
            "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {
                "type": "object", "required": ["id", "object"],
                "properties": {"id": {"type": "string"}, "object": {"const": "model"}}}}},
        },
    }


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": _REF + "Error"}}}}


def _errors(variant: Variant, generation: bool) -> dict[str, Any]:
    out = {
        "400": _error("a parameter is invalid; `error.param` names it"),
        "413": _error("the request body is larger than spec.requestLimits.maxBodyBytes"),
        "431": _error("the request headers are larger than spec.requestLimits.maxHeaderBytes"),
    }
    if generation:
        out["404"] = _error("the model is not served here")
        out["429"] = _error("overloaded; retry after Retry-After seconds")
        out["503"] = _error("no capacity right now; retry after Retry-After seconds")
    if variant == "router":
        out["401"] = _error("missing or unknown API key (when the router checks keys)")
        out["502"] = _error("every replica that was tried failed")
        out["504"] = _error("the replica did not answer in time")
    else:
        out["401"] = _error("the engine serves its fleet's router only (internal token missing)")
    return out


def _generation_op(variant: Variant, op_id: str, summary: str, request: str, response: str) -> dict[str, Any]:
    return {"post": {
        "operationId": op_id,
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": _REF + request}}}},
        "responses": {
            "200": {"description": "the completion; with stream: true, server-sent events ending in [DONE]",
                    "content": {"application/json": {"schema": {"$ref": _REF + response}},
                                "text/event-stream": {"schema": {"$ref": _REF + "ServerSentEvent"}}}},
            **_errors(variant, generation=True),
        },
    }}


def openapi_document(variant: Variant, models: Sequence[str] = ()) -> dict[str, Any]:
    """The document for the router or an engine; `models` (when known) pins the `model` parameter."""
    if variant not in ("engine", "router"):
        raise ValueError(f"variant: got {variant!r}; allowed values: engine, router")
    paths: dict[str, Any] = {
        "/v1/chat/completions": _generation_op(variant, "createChatCompletion", "Chat completion",
                                               "ChatCompletionRequest", "ChatCompletion"),
        "/v1/completions": _generation_op(variant, "createCompletion", "Text completion",
                                          "CompletionRequest", "Completion"),
        "/v1/models": {"get": {
            "operationId": "listModels",
            "responses": {"200": {"description": "the served models",
                                  "content": {"application/json": {"schema": {"$ref": _REF + "ModelList"}}}},
                          **_errors(variant, generation=False)},
        }},
        "/v1/models/{model}": {"get": {
            "operationId": "retrieveModel",
            "summary": "The served model's card (the openai client's models.retrieve)",
            "parameters": [{"name": "model", "in": "path", "required": True,
                            "schema": {"type": "string", "description": "the served model name"}}],
            "responses": {"200": {"description": "the model's card",
                                  "content": {"application/json": {"schema": {"$ref": _REF + "Model"}}}},
                          "404": _error("no model of that name is served here (code model_not_found)"),
                          **_errors(variant, generation=False)},
        }},
        "/health": {"get": {
            "operationId": "health",
            "security": [],
            "responses": {"200": {"description": "ready", "content": {"application/json": {"schema": {
                              "type": "object", "required": ["status"]}}}},
                          "503": {"description": "no healthy replica (router)",
                                  "content": {"application/json": {"schema": {"type": "object"}}}}},
        }},
    }
    if variant == "router":
        invocations = _generation_op(variant, "invoke", "SageMaker's invocation path: a chat body (messages) or a "
                                     "completions body (prompt), answered as that OpenAI route",
                                     "ChatCompletionRequest", "ChatCompletion")
        invocations["post"]["requestBody"]["content"]["application/json"]["schema"] = {
            "oneOf": [{"$ref": _REF + "ChatCompletionRequest"}, {"$ref": _REF + "CompletionRequest"}]}
        invocations["post"]["responses"]["200"]["content"]["application/json"]["schema"] = {
            "oneOf": [{"$ref": _REF + "ChatCompletion"}, {"$ref": _REF + "Completion"}]}
        paths["/invocations"] = invocations
        paths["/metrics"] = {"get": {
            "operationId": "metrics",
            "responses": {"200": {"description": "Prometheus text exposition",
                                  "content": {"text/plain": {"schema": {"type": "string"}}}},
                          "401": _error("tenant names are in the series: admin or internal token only")},
        }}
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": f"fleetserve {variant}", "version": "1",
                 "description": "OpenAI-compatible inference API; errors are {error: {message, type, param, code}}"},
        "paths": paths,
        "components": {"schemas": _schemas(models)},
    }
    if variant == "router":
        doc["components"]["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{}, {"apiKey": []}]  # keys are optional: only when the router is started with auth
    return doc


def openapi_endpoint(variant: Variant, models: Sequence[str] = ()):
    """A Starlette endpoint serving the document (built once: it never changes while a server runs)."""
    response_body = openapi_document(variant, models)

    async def endpoint(request: Request) -> JSONResponse:
        return JSONResponse(response_body)

    return endpoint
