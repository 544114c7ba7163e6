"""What a web page may send without a preflight, judged as the router and a lone engine judge it."""

from fleetserve.api.browser import cross_site, post_refusal, scope_post_refusal


def test_a_page_of_the_servers_own_origin_passes_behind_a_proxy_that_rewrites_host():
    """nginx's default proxy_pass sends Host 127.0.0.1:8000: a same-origin web UI at gpu-box.lan had every POST
    refused, where the proxy said the Host it was called with (a page cannot set X-Forwarded-Host itself)."""
    page = {b"origin": b"http://gpu-box.lan"}
    assert cross_site(page, b"127.0.0.1:8000")
    assert not cross_site({**page, b"x-forwarded-host": b"gpu-box.lan"}, b"127.0.0.1:8000")
    assert not cross_site({**page, b"x-forwarded-host": b"GPU-box.lan, inner.proxy"}, b"127.0.0.1:8000")
    assert cross_site({b"origin": b"http://evil.example", b"x-forwarded-host": b"gpu-box.lan"}, b"127.0.0.1")
    assert cross_site({b"origin": b"null"}, b"127.0.0.1")
    assert cross_site({b"sec-fetch-site": b"cross-site", b"x-forwarded-host": b"x"}, b"x")  # the browser's word
    assert not cross_site({b"x-forwarded-host": b"x"}, b"y")  # no browser said anything: a server's client


def test_the_refusals_name_what_to_send_instead():
    assert post_refusal({}, b"h", b"text/plain; charset=utf-8", None).status == 415
    assert post_refusal({}, b"h", b"application/json", b"gzip").code == "unsupported_media_type"
    assert post_refusal({}, b"h", b"application/json", b"identity") is None
    assert post_refusal({b"x-forwarded-host": b"elsewhere"}, b"h", None, None) is None
    headers = [(b"host", b"127.0.0.1:9"), (b"origin", b"http://127.0.0.1:9"), (b"content-type", b"application/json")]
    assert scope_post_refusal(headers) is None
    assert scope_post_refusal([*headers[:1], (b"sec-fetch-site", b"same-site")]).code == "cross_site_request"


def test_only_json_or_no_content_type_is_read_as_json():
    """image/png, text/html, application/xml and garbage were read as JSON: only the form types were refused."""
    for given in (b"image/png", b"text/html", b"application/xml", b"application/octet-stream", b"garbage",
                  b"text/json+", b"+json"):
        refused = post_refusal({}, b"h", given, None)
        assert refused is not None and refused.status == 415 and given.decode() in refused.message, given
    for given in (b"application/json", b"Application/JSON; charset=utf-8", b"application/vnd.api+json", None, b""):
        assert post_refusal({}, b"h", given, None) is None, given
    # SageMaker's /invocations: its SDK's Predictor sends application/octet-stream by default
    assert post_refusal({}, b"h", b"application/octet-stream", None, any_but_forms=True) is None
    assert post_refusal({}, b"h", b"text/plain", None, any_but_forms=True).status == 415
