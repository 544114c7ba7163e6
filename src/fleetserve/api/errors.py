"""Errors in the OpenAI JSON shape: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

_TYPES = {  # OpenAI's: a bad key (401, code invalid_api_key) and an unknown model (404, model_not_found) are
    # invalid_request_error there too; clients that branch on `type` read them as OpenAI's
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled",
    500: "server_error",
    502: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class APIError(Exception):
    """An error to return to an OpenAI client; `param` names the offending request field."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.after_attempts = False  # the router raised it after trying replicas (router/dispatch.py)

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self):
        """The error as a starlette response. Imported here, not at the top: the request checks that raise these
        errors (`api.protocol`) are pure, and the simulator's trace loader runs them without a server."""
        from starlette.responses import JSONResponse

        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code=code)


MODEL_NOT_FOUND = "model_not_found"


def model_not_found(name: str, served) -> APIError:
    """404 for a model name the endpoint does not serve (`served`: the names it does), as engines and router say it."""
    shown = repr(name) if len(name) <= 200 else repr(name[:200]) + f" (cut; {len(name):,} characters)"  # echoed
    # whole, a 100 KB name came back in full
    return APIError(404, f"model {shown} does not exist; this endpoint serves {', '.join(map(repr, served))}",
                    param="model", code=MODEL_NOT_FOUND)


HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


async def starlette_http_error(request, exc):
    """A starlette HTTPException (no route, wrong method) as OpenAI error JSON, the same from the router's control
    app and both engines, with its headers (405's `Allow`): they had differed in code and header."""
    return APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                    code=HTTP_CODES.get(exc.status_code), headers=dict(exc.headers or {})).response()


def api_app(routes, server_error=None, lifespan=None):
    """A Starlette app of ours (the router's control app, both engines): a missing route or a wrong method as
    OpenAI error JSON, and a trailing slash answered 404, never a 307 redirect to the client's own Host header
    (the router's control app had redirected `/health/` to `http://evil.example/health`)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException

    handlers = {HTTPException: starlette_http_error}
    if server_error is not None:
        handlers[Exception] = server_error
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.router.redirect_slashes = False
    return app


def engine_stopped() -> APIError:
    """What a request still under way gets when its engine's drain time (--drain-timeout) runs out at a stop: in a
    stream, an error event and [DONE], where the answer had been cut off mid-stream."""
    return APIError(503, "the engine stopped (a restart, a scale-in or the fleet's stop) and its drain time ran "
                         "out before this answer finished (in a fleet spec.engine.drainTimeoutSeconds, at the "
                         "fleet's stop the shorter of it and router.bufferTimeoutSeconds; an engine run alone: its "
                         "--drain-timeout); it is incomplete: retry", code="engine_stopping")
