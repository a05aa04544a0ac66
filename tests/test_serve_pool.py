"""Several models behind one endpoint and the hot swap, over real HTTP (uvicorn) and a real MLflow
registry: a temp home with a registered adapter and a champion composite on the tiny model
(``test_serve_registry.registered``), a second composite promoted while clients keep sending."""

from __future__ import annotations

import gc
import json
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import mlflow
import pytest
from random_adapters import random_adapter
from test_serve import running
from test_serve_registry import ADAPTER, CAP, WEATHER, registered  # noqa: F401 - the fixture

from traceops import config, registry
from traceops.lineage import current_lineage
from traceops.serve import RELOAD_KEY_HEADER, VERSION_HEADER, create_app
from traceops.served import resolve_serve_spec
from traceops.serving.params import ServeParams
from traceops.serving.pool import ModelPool
from traceops.traffic import ServedTraffic

KEY = "reload-key-3f9a"


def _ask(url: str, model: str | None = None, content: str = "Weather in Paris?") -> httpx.Response:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": content}], "tools": [WEATHER],
                            "max_tokens": 3}
    if model is not None:
        body["model"] = model
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def _register_second_composite(home: Path, tiny_model_dir: Path) -> str:
    """traceops.composite version 2 (another random adapter); returns its version."""
    from transformers import AutoModelForCausalLM

    from traceops.mlflow_models.registration import register_adapter, register_composite
    from traceops.moe import build_moe, save_moe

    paths = config.load(home).paths
    registry.configure(paths)
    lineage = current_lineage(paths, str(tiny_model_dir), diagnosis_run="")
    adapter = random_adapter(tiny_model_dir, home / "trained2" / CAP, seed=11)
    composite = save_moe(build_moe(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
                                   {CAP: adapter}, top_k=1), home / "trained2" / "composite")
    with mlflow.start_run(experiment_id=registry.ensure_experiment(paths, "train")):
        adapter_ref = register_adapter(adapter, CAP, lineage, base_model=str(tiny_model_dir))
    with mlflow.start_run(experiment_id=registry.ensure_experiment(paths, "route")):
        ref = register_composite(composite, lineage, {ADAPTER: adapter_ref.version},
                                 base_model=str(tiny_model_dir))
    return ref.version


def test_several_models_one_endpoint_and_hot_swap(registered: Path, tiny_model_dir: Path,  # noqa: F811
                                                  tmp_path: Path) -> None:
    import torch

    torch.set_num_threads(2)
    paths = config.load(registered).paths
    pool = ModelPool.from_target(resolve_serve_spec(None, paths), paths, ServeParams(poll_seconds=0))
    traffic = ServedTraffic(tmp_path / "served")
    with running(create_app(pool, reload_key=KEY, traffic=traffic)) as url:
        models = {m["id"]: m for m in httpx.get(f"{url}/v1/models").json()["data"]}
        composite, adapter = models[registry.COMPOSITE_MODEL], models[ADAPTER]
        (base_id,) = [i for i, m in models.items() if m["traceops_kind"] == "base"]
        assert composite["traceops_default"] and composite["traceops_loaded"]
        assert composite["traceops_registered"]["version"] == "1"
        assert composite["traceops_registered"]["aliases"] == ["champion"]
        assert len(composite["traceops_weights_hash"]) == 64
        assert not adapter["traceops_loaded"] and adapter["traceops_registered"]["version"] == "1"
        assert models[base_id]["traceops_weights_hash"]  # the base's hash is known before it loads

        # The request's model picks the model; no model is the default; lazy loading on first use.
        v1 = _ask(url).json()["system_fingerprint"]
        assert v1.startswith(f"{registry.COMPOSITE_MODEL}/1:")
        for name in ("traceops.composite@champion", "models:/traceops.composite/1", registry.COMPOSITE_MODEL):
            reply = _ask(url, name)
            assert reply.status_code == 200 and reply.json()["system_fingerprint"] == v1
            assert reply.json()["model"] == registry.COMPOSITE_MODEL and reply.headers[VERSION_HEADER] == v1
        by_adapter = _ask(url, ADAPTER)
        assert by_adapter.status_code == 200 and by_adapter.json()["model"] == ADAPTER
        assert by_adapter.json()["system_fingerprint"].startswith(f"{ADAPTER}/1:")
        by_base = _ask(url, base_id).json()
        assert by_base["model"] == base_id and by_base["system_fingerprint"].startswith(f"{base_id}:")
        listed = {m["id"]: m for m in httpx.get(f"{url}/v1/models").json()["data"]}
        assert listed[ADAPTER]["traceops_loaded"] and listed[base_id]["traceops_loaded"]
        missing = _ask(url, "traceops.composite/2")
        assert missing.status_code == 404
        message = missing.json()["error"]["message"]
        assert "served at version 1" in message and all(i in message for i in models)

        # Every 200 exchange is in the traffic log, with the version that served it.
        lines = [json.loads(line) for f in (tmp_path / "served").glob("*.jsonl")
                 if not f.name.endswith(".outcomes.jsonl") for line in f.read_text().splitlines()]
        assert len(lines) == 6
        assert {line["metadata"]["served_by"]["model"] for line in lines} == {
            registry.COMPOSITE_MODEL, ADAPTER, base_id}

        # Reload is authenticated.
        assert httpx.post(f"{url}/v1/reload").status_code == 401
        wrong = httpx.post(f"{url}/v1/reload", headers={RELOAD_KEY_HEADER: "nope"})
        assert wrong.status_code == 403 and "--reload-key-env" in wrong.json()["error"]["message"]

        # A promotion under load: clients keep sending while v2 loads beside v1 and takes over.
        version = _register_second_composite(registered, tiny_model_dir)
        registry.set_alias(registry.COMPOSITE_MODEL, registry.CHAMPION, version)
        stop, results = threading.Event(), []
        first = pool.entry(None).served

        def client(index: int) -> None:
            while not stop.is_set():
                results.append(_ask(url, None if index % 2 else registry.COMPOSITE_MODEL, f"client {index}"))

        with ThreadPoolExecutor(6) as clients:
            for index in range(6):
                clients.submit(client, index)
            time.sleep(0.5)
            swapped = httpx.post(f"{url}/v1/reload", headers={RELOAD_KEY_HEADER: KEY}, timeout=300)
            time.sleep(0.5)
            stop.set()
        assert swapped.status_code == 200, swapped.text
        # The champion moved; the adapter, which has no champion alias, follows its latest version.
        assert swapped.json()["changed"] == [
            {"model": registry.COMPOSITE_MODEL, "from": "1", "to": version, "loaded": True},
            {"model": ADAPTER, "from": "1", "to": "2", "loaded": True}]
        failed = [r.text for r in results if r.status_code != 200]
        assert results and not failed, failed
        fingerprints = [r.json()["system_fingerprint"] for r in results]
        v2 = _ask(url).json()["system_fingerprint"]
        assert v2.startswith(f"{registry.COMPOSITE_MODEL}/{version}:") and v2 != v1
        assert set(fingerprints) <= {v1, v2} and fingerprints[-1] == v2
        assert all(r.headers[VERSION_HEADER] == r.json()["system_fingerprint"] for r in results)
        assert first is not None and first.fingerprint == v1
        first.batcher._thread.join(30)  # v1 answered what it had queued, then let its weights go
        assert first.batcher.closed and first.batcher.model is None

        # The poll follows a rollback without a reload call; the old version's batcher let go.
        old = pool.entry(None)
        registry.set_alias(registry.COMPOSITE_MODEL, registry.CHAMPION, "1")
        pool.start_polling(0.2)
        deadline = time.monotonic() + 120
        while _ask(url).json()["system_fingerprint"] != v1:
            assert time.monotonic() < deadline, "the poll did not swap back"
            time.sleep(0.2)
        assert old.served is not None and old.served.ref is not None and old.served.ref.version == "1"
        assert old.target is not None and old.target.ref == old.served.ref
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["traceops_registered"]["version"] == "1"


def test_reload_is_refused_without_a_key(registered: Path) -> None:  # noqa: F811
    paths = config.load(registered).paths
    target = resolve_serve_spec(f"{ADAPTER}/1", paths)
    pool = ModelPool.from_target(target, paths, ServeParams(poll_seconds=0))
    with running(create_app(pool)) as url:
        refused = httpx.post(f"{url}/v1/reload", headers={RELOAD_KEY_HEADER: KEY})
        assert refused.status_code == 403 and "--reload-key-env" in refused.json()["error"]["message"]
        # A version named explicitly is served under that name and never follows an alias.
        ids = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
        assert ids[0] == f"{ADAPTER}/1" and registry.COMPOSITE_MODEL in ids
        assert _ask(url).json()["system_fingerprint"].startswith(f"{ADAPTER}/1:")
    assert pool.reload() == []


@pytest.mark.parametrize("bad", [{"queue_size": 0}, {"poll_seconds": -1}, {"max_batch": "x"}, {"nope": 1},
                                 {"redact": "sk-.*"}, {"log_traffic": "yes"}, {"max_loaded_models": 0},
                                 {"max_loaded_models": "4"}, {"domain": ""}, {"domain": 3}])
def test_serve_params_are_checked(bad: dict[str, Any]) -> None:
    from traceops.errors import ConfigError

    with pytest.raises(ConfigError, match="params.yaml serve"):
        ServeParams.from_params(bad)


def test_loaded_models_are_capped_least_recently_used_idle_first(registered: Path) -> None:  # noqa: F811
    import torch

    torch.set_num_threads(2)
    paths = config.load(registered).paths
    pool = ModelPool.from_target(resolve_serve_spec(None, paths), paths,
                                 ServeParams(poll_seconds=0, max_loaded_models=2))
    with running(create_app(pool)) as url:
        def loaded() -> dict[str, bool]:
            return {m["id"]: m["traceops_loaded"] for m in httpx.get(f"{url}/v1/models").json()["data"]}

        (base_id,) = [i for i in pool.ids if pool.entry(i).kind == "base"]
        assert _ask(url, ADAPTER).status_code == 200
        assert loaded() == {registry.COMPOSITE_MODEL: True, ADAPTER: True, base_id: False}
        adapter_served = pool.entry(ADAPTER).served
        # A third model unloads the least recently used idle one (never the default) and frees it.
        assert _ask(url).status_code == 200  # the default is used last: still never a candidate
        assert _ask(url, base_id).status_code == 200
        assert loaded() == {registry.COMPOSITE_MODEL: True, ADAPTER: False, base_id: True}
        assert adapter_served is not None and adapter_served.batcher.closed
        assert adapter_served.batcher.model is None
        weights = weakref.ref(adapter_served.model)
        del adapter_served
        gc.collect()
        assert weights() is None, "the unloaded model is still referenced: its memory was not freed"
        # The unloaded model is still served: it loads again, and the base (now least recent) goes.
        again = _ask(url, ADAPTER)
        assert again.status_code == 200 and again.json()["system_fingerprint"].startswith(f"{ADAPTER}/")
        assert loaded() == {registry.COMPOSITE_MODEL: True, ADAPTER: True, base_id: False}

        # Every loaded model busy: 503 with Retry-After instead of a third model in memory.
        busy_adapter = pool.entry(ADAPTER).served
        assert busy_adapter is not None
        body = {"model": ADAPTER, "messages": [{"role": "user", "content": "Tell me everything."}],
                "max_tokens": 3000}
        with ThreadPoolExecutor(1) as client:
            long = client.submit(httpx.post, f"{url}/v1/chat/completions", json=body, timeout=600)
            deadline = time.monotonic() + 60
            while not busy_adapter.batcher.busy:
                assert time.monotonic() < deadline and not long.done(), "the long request never ran"
                time.sleep(0.01)
            refused = _ask(url, base_id)
            still_running = busy_adapter.batcher.busy
            answered = long.result()
        assert still_running, "the long request ended before the base was asked for: make it longer"
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert "serve.max_loaded_models is 2" in refused.json()["error"]["message"]
        assert answered.status_code == 200
        assert loaded() == {registry.COMPOSITE_MODEL: True, ADAPTER: True, base_id: False}
        assert _ask(url, base_id).status_code == 200  # idle again: the adapter makes room
        assert loaded() == {registry.COMPOSITE_MODEL: True, ADAPTER: False, base_id: True}

    # A cap of one holds only the default: another model is refused with what to change.
    single = ModelPool.from_target(resolve_serve_spec(None, paths), paths,
                                   ServeParams(poll_seconds=0, max_loaded_models=1))
    with running(create_app(single)) as url:
        refused = _ask(url, ADAPTER)
        assert refused.status_code == 503 and "raise serve.max_loaded_models" in refused.text
        assert _ask(url).status_code == 200
