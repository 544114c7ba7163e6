"""SageMaker's invocation path on the gateway: `POST /invocations`, HyperPod's default `invocationEndpoint`.

SageMaker's InvokeEndpoint and HyperPod's `hyp invoke` post every request to one path, and vLLM's server (the
engine of most HyperPod samples) answers it by the body's shape. The gateway does the same before anything else
reads the path: a body with `messages` is a chat completion, one with `prompt` a completion, and from there on the
request is that OpenAI route's (auth, admission, routing, retries, relay, metrics, access log), so every engine
behind the gateway serves it, ours included. TGI's and DJL-LMI's own schema (`inputs`, `parameters`) is refused
with the bodies that are served: translating it would answer in a third response shape.
"""

from __future__ import annotations

from fleetserve.api.errors import APIError

INVOCATIONS_PATH = "/invocations"
_SHAPES = (("messages", "/v1/chat/completions"), ("prompt", "/v1/completions"))
_SERVED = "an OpenAI chat completions body (with `messages`) or completions body (with `prompt`)"


def openai_path(body: dict) -> str:
    """The OpenAI route an /invocations body is for; a 400 naming the bodies served otherwise."""
    found = [path for key, path in _SHAPES if key in body]
    if len(found) == 1:
        return found[0]
    if found:
        raise APIError(400, f"an /invocations body has `messages` or `prompt`, not both; send {_SERVED}",
                       param="prompt", code="invalid_value")
    if "inputs" in body:
        raise APIError(400, "`inputs` (the TGI / DJL-LMI schema) is not served on /invocations; send " + _SERVED,
                       param="inputs", code="invalid_value")
    raise APIError(400, f"an /invocations body must be {_SERVED}", param="messages", code="missing_required_parameter")
