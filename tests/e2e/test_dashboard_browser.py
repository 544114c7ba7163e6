"""The router's /dashboard in a real headless Chromium (the system browser), on a running fleet under traffic.

The screenshot is kept as a test artifact: its path is printed (run with -s to see it)."""

from __future__ import annotations

import json
import shutil
import threading

import httpx
import openai
import pytest

from tests.helpers import fleetserve

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# panels that must draw data under traffic (cache tiers and predictions depend on prompt reuse and policy)
MUST_SHOW = ("latency", "ttfb", "concurrency", "errors", "throughput", "latency_by_instance", "replicas",
             "nodes", "cost", "cached_tokens")

SPEC = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {{name: dash, namespace: team-a}}
spec:
  model: {{name: tiny, source: "{source}", version: "7"}}
  engine: {{threads: 1}}
  replicas: 1
  routing: {{strategy: prefixaware}}
"""


def traffic(url: str, stop: threading.Event) -> None:
    """Streamed chats (TTFB) and token-id prompts that share a 256-token engine block (cache hits, predictions)."""
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
    shared = [(i * 7) % 200 + 1 for i in range(300)]
    i = 0
    while not stop.is_set():
        try:
            if i % 2:
                client.completions.create(model="tiny", max_tokens=4, prompt=[*shared, i % 50 + 1, 3])
            else:
                for _chunk in client.chat.completions.create(
                        model="tiny", max_tokens=4, stream=True,
                        messages=[{"role": "user", "content": f"Where is my bicycle order {i % 5}?"}]):
                    pass
        except openai.OpenAIError:
            pass
        i += 1


def test_dashboard_in_headless_chromium_shows_live_panels(tmp_path, tiny_model, home):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs the Debian package as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright missing: pip install -e '.[test]'")
    spec = tmp_path / "dash.yaml"
    spec.write_text(SPEC.format(source=tiny_model))
    up = fleetserve("up", str(spec), "--detach", env=home)
    assert up.returncode == 0, up.stderr
    stop = threading.Event()
    try:
        (state,) = json.loads(fleetserve("status", "--json", env=home, check=True).stdout)
        opened = fleetserve("dashboard", "open", "dash", env=home, check=True).stdout.strip()
        base = state["url"].removesuffix("/v1")
        assert opened.startswith(base + "/dashboard?login=")  # a code that expires, not the fleet's token
        assert httpx.get(base + "/dashboard", timeout=5).status_code in (200, 403)  # loopback, or token-only
        worker = threading.Thread(target=traffic, args=(state["url"], stop), daemon=True)
        worker.start()
        shot = tmp_path / "dashboard.png"
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1366, "height": 768})  # a laptop screen
                external = []
                page.on("request", lambda r: external.append(r.url) if not r.url.startswith(base) else None)
                console_errors = []  # a /favicon.ico 404 logged one on every load
                page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
                page.goto(opened, wait_until="load")
                assert page.url == base + "/dashboard"  # the login went into a cookie, out of the address bar
                selector = " && ".join(f"+document.getElementById('panel-{k}').dataset.points > 0" for k in MUST_SHOW)
                page.wait_for_function(f"() => document.body.dataset.loaded === '1' && {selector}",
                                       timeout=120_000, polling=500)
                page.wait_for_timeout(2500)  # one more refresh: lines, not single points
                values = {k: page.locator(f"#panel-{k} .value").inner_text() for k in MUST_SHOW}
                points = {k: int(page.locator(f"#panel-{k}").get_attribute("data-points")) for k in MUST_SHOW}
                paths = page.locator("#panel-latency svg path").count()
                # every axis label inside its panel: "0.33 tokens/s" right-aligned at 40 px lost its number
                clipped = page.evaluate("() => [...document.querySelectorAll('.panel svg text')]"
                                        ".filter(t => t.getBBox().x < 0).map(t => t.textContent)")
                page.screenshot(path=str(shot), full_page=True)
                with page.expect_request(lambda r: "instance_type=local" in r.url, timeout=10_000):
                    page.select_option("#filter-instance_type", "local")  # the filters are the label values seen
                page.wait_for_timeout(500)
                filtered = int(page.locator("#panel-latency").get_attribute("data-points"))
                title = page.locator("#title").inner_text()
                errors_while_up = list(console_errors)
                stale_before = page.evaluate("() => document.body.classList.contains('stale')")
                stop.set()
                fleetserve("down", "dash", env=home)  # the page must say its data is old, not show it as live
                page.wait_for_function("() => document.body.classList.contains('stale')", timeout=30_000)
                banner = page.locator("#stale").inner_text()
            finally:
                browser.close()
        print(f"\ndashboard screenshot: {shot}")
        assert shot.stat().st_size > 10_000
        assert external == [], f"the page fetched outside the router: {external}"
        assert errors_while_up == [] and clipped == [], (errors_while_up, clipped)
        assert title == "fleetserve \u00b7 tiny" and not stale_before
        assert banner.startswith("No data since ") and "does not answer" in banner, banner
        assert all(n > 0 for n in points.values()), points
        assert values["latency"] != "-" and values["ttfb"] != "-" and paths >= 1, values
        assert values["replicas"] == "2 series" and values["cost"].startswith("$"), values
        assert filtered > 0
    finally:
        stop.set()
        fleetserve("down", "dash", env=home)
