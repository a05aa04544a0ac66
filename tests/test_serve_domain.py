"""Served records ingest under the domain the served model was trained on: a temp home whose registry
holds an adapter and a champion composite on the tiny model, registered with the environments version of
a synthesize run whose manifest names the grounding's domain (as the nightly flow registers them); real
HTTP (uvicorn), the real traffic log, then a real ingest of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import mlflow
import pytest
from test_serve import running
from test_serve_registry import ADAPTER, CAP, WEATHER, register_champion

from traceops import config, registry
from traceops.ingest import ingest_paths
from traceops.lineage import current_lineage
from traceops.serve import DOMAIN_HEADER, create_app
from traceops.served import resolve_serve_spec
from traceops.serving.domain import MANIFEST_ARTIFACT, trained_domains
from traceops.serving.params import ServeParams
from traceops.serving.pool import ModelPool
from traceops.store import load_trajectories
from traceops.tags import TAG_ENV_VERSION
from traceops.traffic import ServedTraffic

ENV_VERSION = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"


@pytest.fixture(scope="module")
def trained_home(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A home whose adapter and composite were trained on environments grounded in the retail domain."""

    from traceops.flows.runtime import prepare
    from traceops.tasks.tracking import log_json, stage_run

    home = tmp_path_factory.mktemp("domain-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRACEOPS_HOME", str(home))
        patch.setenv("PREFECT_HOME", str(home / ".prefect"))
        settings = prepare(home)
        paths = settings.paths
        # What the synthesize task records: the environments version and each capability's manifest.
        with stage_run(settings, "synthesize"):
            mlflow.set_tag(TAG_ENV_VERSION, ENV_VERSION)
            log_json({"capability": CAP, "grounding": {"source": "logs", "domain": "retail"}},
                     MANIFEST_ARTIFACT.format(capability=CAP))
        lineage = {**current_lineage(paths, str(tiny_model_dir), diagnosis_run=""),
                   TAG_ENV_VERSION: ENV_VERSION}
        register_champion(home, paths, tiny_model_dir, lineage, seed=5)
        yield home


def _ask(url: str, model: str | None = None, headers: dict[str, str] | None = None,
         metadata: dict[str, str] | None = None) -> str:
    body: dict = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
                  "max_tokens": 3}
    if model is not None:
        body["model"] = model
    if metadata is not None:
        body["metadata"] = metadata
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers or {}, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()["id"]


def test_served_records_ingest_under_the_models_training_domain(trained_home: Path) -> None:
    import torch

    torch.set_num_threads(2)
    settings = config.load(trained_home)
    paths = settings.paths
    composite = registry.get_alias(registry.COMPOSITE_MODEL, registry.CHAMPION)
    assert composite is not None and trained_domains(composite, paths) == {"retail"}
    served_dir = paths.raw / "served"
    pool = ModelPool.from_target(resolve_serve_spec(None, paths), paths, ServeParams(poll_seconds=0))
    with running(create_app(pool, traffic=ServedTraffic(served_dir))) as url:
        (base_id,) = [i for i in pool.ids if pool.entry(i).kind == "base"]
        expected = {
            _ask(url): "retail",                                        # the composite's adapters' domain
            _ask(url, ADAPTER): "retail",                               # the adapter's own environments
            _ask(url, headers={DOMAIN_HEADER: "airline"}): "airline",   # the client's header
            _ask(url, metadata={"domain": "telecom"}): "telecom",       # the body's metadata
            _ask(url, base_id): "unknown",                              # the base: trained on nothing
        }
    # serve.domain names the domain of every exchange the request does not.
    configured = ModelPool.from_target(resolve_serve_spec(None, paths), paths,
                                       ServeParams(poll_seconds=0, domain="bank"))
    with running(create_app(configured, traffic=ServedTraffic(served_dir))) as url:
        expected[_ask(url, base_id)] = "bank"
        expected[_ask(url, headers={DOMAIN_HEADER: "airline"})] = "airline"

    result = ingest_paths([served_dir], settings, run_id="served-domains", workers=1)
    assert (result.read, result.accepted, result.quarantined) == (len(expected), len(expected), 0)
    assert {t.task_id: t.domain for t in load_trajectories(paths)} == expected
