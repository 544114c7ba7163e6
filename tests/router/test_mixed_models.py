"""Replicas of two models behind one router: every request goes to any replica, so half were answered 404 "model
does not exist" for a model the router's /v1/models had just listed, and the log said only "healthy". The router
now says it, once for each two lists of models that share none."""

from __future__ import annotations

import httpx

from tests.helpers import Server, wait_until


def test_a_router_says_when_its_replicas_serve_different_models(tmp_path):
    engines = [Server(["engine", "--simulate", "fast", "--served-model-name", name], tmp_path / f"{name}.log").start()
               for name in ("alpha", "beta", "beta")]
    log = tmp_path / "router.log"
    gw = Server(["router", *[a for e in engines for a in ("--backend", e.url)], "--health-interval", "0.2"],
                log).start()
    try:
        wait_until(lambda: "serve different models" in log.read_text(), 30, what="the warning")
        for name in ("alpha", "beta") * 3:  # rounds go by meanwhile (0.2 s each)
            httpx.post(gw.url + "/v1/completions", json={"model": name, "prompt": "hi", "max_tokens": 2}, timeout=30)
        said = [line for line in log.read_text().splitlines() if "serve different models" in line]
        assert len(said) == 1, said  # once for the two lists, not per replica nor per round
        assert "['alpha']" in said[0] and "['beta']" in said[0] and "one router per model" in said[0]
    finally:
        gw.stop()
        for e in engines:
            e.stop()


def test_replicas_of_one_model_say_nothing(tmp_path):
    engines = [Server(["engine", "--simulate", "fast", "--served-model-name", "same"], tmp_path / f"e{i}.log").start()
               for i in range(2)]
    log = tmp_path / "router.log"
    gw = Server(["router", *[a for e in engines for a in ("--backend", e.url)], "--health-interval", "0.2"],
                log).start()
    try:
        for _ in range(6):
            r = httpx.post(gw.url + "/v1/completions", json={"model": "same", "prompt": "hi", "max_tokens": 2},
                           timeout=30)
            assert r.status_code == 200
        assert "serve different models" not in log.read_text()
    finally:
        gw.stop()
        for e in engines:
            e.stop()


def test_a_replica_whose_model_list_never_answers_is_asked_three_rounds_only():
    """Each ask waits up to 2 s in the health round: a replica whose /v1/models hangs had been asked every round."""
    import asyncio
    from types import SimpleNamespace

    from fleetserve.router.upstream import UpstreamError
    from fleetserve.router.watcher import MODELS_TRIES, ReplicaWatcher

    asked = []
    hung = SimpleNamespace(id="a", url="http://a")

    async def get_json(url, timeout):
        asked.append(url)
        raise UpstreamError("timed out")

    pool = SimpleNamespace(backends={"a": hung}, healthy=lambda: [hung])
    watcher = ReplicaWatcher(SimpleNamespace(pool=pool, upstream=SimpleNamespace(get_json=get_json)))
    for _ in range(MODELS_TRIES + 3):
        asyncio.run(watcher._check_models())
    assert len(asked) == MODELS_TRIES and watcher.models_of == {"a": frozenset()}
    pool.backends.clear()  # it leaves: forgotten, asked again if it comes back
    asyncio.run(watcher._check_models())
    assert watcher.models_of == {} and watcher._models_tries == {}
