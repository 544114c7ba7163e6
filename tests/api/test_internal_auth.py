"""The internal token's checks take any header a client can send: a non-ASCII value is a wrong token, never a
TypeError (`hmac.compare_digest` refuses non-ASCII strings, and the engine's guard answered a plain-text 500)."""

import asyncio

from fleetserve.api.internal import EngineGuard, InternalAuth, header_has_secret, same_secret


def test_same_secret_compares_any_text():
    assert same_secret("token", "token") and not same_secret("token", "tokem")
    assert not same_secret("t\u00e9", "token") and not same_secret("\ud800", "token")  # a lone surrogate too


def test_the_engines_guard_answers_401_to_a_non_ascii_bearer():
    auth = InternalAuth("secret-token")
    assert not auth.trusted([(b"authorization", "Bearer \u00e9".encode())])
    assert auth.trusted([(b"authorization", b"Bearer secret-token")])
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    odd = [(b"authorization", "Bearer \u00e9".encode())]
    scope = {"type": "http", "method": "GET", "path": "/v1/models", "headers": odd,
             "query_string": b"", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "scheme": "http",
             "root_path": "", "raw_path": b"/v1/models", "http_version": "1.1", "asgi": {"version": "3.0"}}
    asyncio.run(EngineGuard(app, auth)(scope, receive, send))
    assert not reached and sent[0]["status"] == 401


def test_a_non_ascii_secret_in_a_header_is_compared_as_the_bytes_the_client_sent():
    """ASGI decodes header values as latin-1: re-encoded as UTF-8 for the comparison, a correct non-ASCII admin token
    could never match."""
    sent = "t\u00f6ken".encode().decode("latin-1")  # what Starlette hands over for its UTF-8 bytes
    assert header_has_secret(sent, "t\u00f6ken") and not header_has_secret(sent, "token")
    assert header_has_secret("token", "token") and not header_has_secret("\u20ac", "token")


def test_a_non_ascii_internal_token_the_router_sends_reaches_its_engines():
    """The router sends its upstream headers as latin-1: compared with the token in UTF-8 alone, every request to
    an engine of a fleet whose token is not ASCII was a 401."""
    from fleetserve.router.upstream import Upstream

    auth = InternalAuth("schl\u00fcssel-f\u00fcr-die-engines")
    lines = Upstream(headers=auth.headers())._extra.split(b"\r\n")  # the header lines it writes on the wire
    sent = [tuple(line.split(b": ", 1)) for line in lines if line]
    assert len(sent) == 2 and auth.trusted(sent)
