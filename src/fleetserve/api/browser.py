"""What a web page may send to another origin without a CORS preflight, refused at every front door.

A page a user opens may POST a form body, or a body with no content type (fetch's no-cors mode, sendBeacon), to
any address, localhost included, and the browser asks no one first. A router or a lone engine on loopback would
have run it as a request of its own user's. So a POST body must be JSON (or untyped), uncompressed, and, when a
browser says who sent it (Sec-Fetch-Site, else Origin), from the server's own origin. Clients that are not
browsers send neither header.
"""

from __future__ import annotations

from fleetserve.api.errors import APIError

BROWSER_HEADERS = frozenset({b"sec-fetch-site", b"origin"})  # what a browser says of the page that sent a request
FORWARDED_HOST = b"x-forwarded-host"  # the Host a proxy in front was called with (nginx's proxy_pass rewrites Host)


# what a web page may POST to another origin without a preflight: refused on every path
FORM_TYPES = frozenset({b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data"})


def is_json_type(content_type: bytes, any_but_forms: bool = False) -> bool:
    """application/json, or a JSON type of its own (`application/vnd.api+json`), or none (an empty header): what a
    body is read as. Any other had been read as JSON too (`image/png`, `text/html`, `application/xml`), where only
    the form types were refused. `any_but_forms`: SageMaker's /invocations, whose SDK's Predictor sends
    `application/octet-stream` by default: there only the form types are refused."""
    media = content_type.split(b";", 1)[0].strip().lower()
    if any_but_forms:
        return media not in FORM_TYPES
    return media in (b"", b"application/json") or (media.endswith(b"+json") and b"/" in media)


def cross_site(headers: dict[bytes, bytes], host: bytes | None) -> bool:
    """Whether a browser sent the request (`headers`: its Sec-Fetch-Site and Origin, and a proxy's
    X-Forwarded-Host) from a page of another origin than the server's (`host`: the request's Host). A page cannot
    set X-Forwarded-Host on a request it sends without a preflight, so the proxy's word is taken: behind nginx's
    default proxy_pass every same-origin POST of a web UI had been refused."""
    fetch_site = headers.get(b"sec-fetch-site", b"").strip().lower()
    if fetch_site:
        return fetch_site not in (b"same-origin", b"none")
    origin = headers.get(b"origin")
    if origin is None:
        return False
    origin = origin.strip().lower()
    netloc = origin.partition(b"://")[2]
    called = {(host or b"").strip().lower()}
    if FORWARDED_HOST in headers:
        called.add(headers[FORWARDED_HOST].split(b",", 1)[0].strip().lower())
    return origin == b"null" or netloc not in called


def post_refusal(browser: dict[bytes, bytes], host: bytes | None, content_type: bytes | None,
                 encoding: bytes | None, any_but_forms: bool = False) -> APIError | None:
    """The error for a POST a page of another site sent, or whose body is not plain JSON; None when it may go on.
    `any_but_forms`: see `is_json_type`."""
    if (b"origin" in browser or b"sec-fetch-site" in browser) and cross_site(browser, host):
        return APIError(403, "a web page of another site may not call this API (its browser sent Sec-Fetch-Site or "
                             "Origin of another site); call it from a server", code="cross_site_request")
    if content_type is not None and not is_json_type(content_type, any_but_forms):
        return APIError(415, f"content-type {content_type.decode('latin-1')!r}: the body must be JSON; send "
                             "content-type: application/json", code="unsupported_media_type")
    if encoding is not None and encoding.strip().lower() not in (b"", b"identity"):
        # a gzip body read as JSON had been a 400 "'utf-8' codec can't decode byte 0x8b"
        return APIError(415, f"content-encoding {encoding.decode('latin-1')!r} is not accepted: send the body "
                             "uncompressed (content-encoding identity, or none)", code="unsupported_media_type")
    return None


def scope_post_refusal(headers: list[tuple[bytes, bytes]]) -> APIError | None:
    """`post_refusal` for an ASGI request's headers (names lower case, as ASGI gives them)."""
    browser, host, content_type, encoding = {}, None, None, None
    for k, v in headers:
        if k in BROWSER_HEADERS or k == FORWARDED_HOST:
            browser[k] = v
        elif k == b"host":
            host = v
        elif k == b"content-type":
            content_type = v
        elif k == b"content-encoding":
            encoding = v
    return post_refusal(browser, host, content_type, encoding)
