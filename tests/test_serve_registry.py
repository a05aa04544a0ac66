"""``traceops serve`` over what the registry holds: a temp home with a registered random adapter and a
composite (champion) on the tiny model; specs resolved against the real MLflow registry, served models
prompted as evaluation prompts them, and the CLI serving the champion over real HTTP (uvicorn)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import mlflow
import pytest
from random_adapters import random_adapter
from test_serve import _free_port

from traceops import config, registry
from traceops.errors import ConfigError, ModelError
from traceops.evaluation.stage import RoleSpec, load_role_model
from traceops.lineage import current_lineage
from traceops.mlflow_models.registration import register_adapter, register_composite
from traceops.model import load_model
from traceops.model.base import GenerationConfig
from traceops.served import ServeTarget, load_target, resolve_serve_spec

CAP = "tool_call_format"
ADAPTER = registry.adapter_model_name(CAP)
CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def registered(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A home whose registry holds traceops.adapter.tool_call_format/1 and traceops.composite/1 (one
    expert, top-1) with the ``champion`` alias, both on the tiny model; the local folders under trained/."""

    from traceops.flows.runtime import prepare

    home = tmp_path_factory.mktemp("serve-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRACEOPS_HOME", str(home))  # prepare() sets it; the context restores it
        patch.setenv("PREFECT_HOME", str(home / ".prefect"))
        paths = prepare(home).paths
        register_champion(home, paths, tiny_model_dir, current_lineage(paths, str(tiny_model_dir),
                                                                       diagnosis_run=""), seed=3)
        yield home


def register_champion(home: Path, paths: config.Paths, tiny_model_dir: Path, lineage: dict[str, str],
                      seed: int) -> None:
    """Register a random adapter of CAP (version 1) and a one-expert composite over it (version 1, the
    ``champion``) on the tiny model, with ``lineage`` tags; their folders under ``home/trained``."""
    from transformers import AutoModelForCausalLM

    from traceops.moe import build_moe, save_moe

    adapter = random_adapter(tiny_model_dir, home / "trained" / CAP, seed=seed)
    composite = save_moe(build_moe(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
                                   {CAP: adapter}, top_k=1), home / "trained" / "composite")
    with mlflow.start_run(experiment_id=registry.ensure_experiment(paths, "train")):
        register_adapter(adapter, CAP, lineage, base_model=str(tiny_model_dir))
    with mlflow.start_run(experiment_id=registry.ensure_experiment(paths, "route")):
        register_composite(composite, lineage, {ADAPTER: "1"}, base_model=str(tiny_model_dir))
    registry.set_alias(registry.COMPOSITE_MODEL, registry.CHAMPION, "1")


def resolve(spec: str | None, home: Path, base_model: str | None = None) -> ServeTarget:
    return resolve_serve_spec(spec, config.load(home).paths, base_model=base_model)


def test_registry_references_and_folders_resolve(registered: Path, tiny_model_dir: Path) -> None:
    paths = config.load(registered).paths
    champion = resolve(None, registered)
    assert champion.defaulted and champion.kind == "composite"
    assert champion.ref is not None
    assert (champion.ref.name, champion.ref.version) == (registry.COMPOSITE_MODEL, "1")
    # Downloaded into the home's one download cache; the base is the version's recorded spec.
    assert champion.folder is not None and paths.models / "registry" / registry.COMPOSITE_MODEL / "1" in [
        champion.folder, *champion.folder.parents]
    assert champion.base_model_dir == tiny_model_dir.resolve()
    assert "champion" in champion.describe() and "traceops.composite version 1" in champion.describe()
    for spec in ("traceops.composite@champion", "models:/traceops.composite@champion",
                 "traceops.composite/1"):
        target = resolve(spec, registered)
        assert (target.kind, target.ref, target.folder, target.defaulted) == (
            "composite", champion.ref, champion.folder, False)

    adapter = resolve(f"{ADAPTER}/1", registered)
    assert adapter.kind == "adapter" and adapter.ref is not None and adapter.ref.name == ADAPTER
    assert adapter.base_model_dir == tiny_model_dir.resolve()
    assert resolve(f"models:/{ADAPTER}/1", registered).ref == adapter.ref

    # Local folders: the base comes from the folder's own record (PEFT / save_moe), or --base-model.
    local = resolve(str(registered / "trained" / CAP), registered)
    assert (local.kind, local.ref, local.base_model_dir) == ("adapter", None, tiny_model_dir.resolve())
    for base in (None, str(tiny_model_dir)):
        local = resolve(str(registered / "trained" / "composite"), registered, base_model=base)
        assert (local.kind, local.ref, local.base_model_dir) == ("composite", None, tiny_model_dir.resolve())
    # The downloaded champion is a composite folder too: its save_moe record names the base.
    assert resolve(str(champion.folder), registered).base_model_dir == tiny_model_dir.resolve()
    # Any other spec is handed to load_model as before.
    assert resolve(str(tiny_model_dir), registered) == ServeTarget(spec=str(tiny_model_dir), kind="model")


def test_served_models_are_prompted_as_evaluation_prompts_them(registered: Path) -> None:
    config_ = GenerationConfig(max_new_tokens=8)
    for spec, kind in ((None, "composite"), (f"{ADAPTER}/1", "adapter")):
        target = resolve(spec, registered)
        served = load_target(target)
        evaluated = load_role_model(RoleSpec("role", kind, str(target.folder)), target.base_model_dir, 8)
        assert served.info == evaluated.info
        assert served.prompt(CHAT, [WEATHER]) == evaluated.prompt(CHAT, [WEATHER])  # type: ignore[attr-defined]
        assert served.generate([CHAT], [WEATHER], config_) == evaluated.generate([CHAT], [WEATHER], config_)


def test_bad_references_say_what_to_send(registered: Path, tmp_path: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"no alias 'nope'.*versions 1 and aliases @champion.*serve one"):
        resolve("traceops.composite@nope", registered)
    with pytest.raises(ConfigError, match=r"registered models: traceops.adapter.tool_call_format, "
                                          r"traceops.composite"):
        resolve("traceops.adapter.missing/1", registered)
    with pytest.raises(ConfigError, match=r"traceops.composite/7 does not exist.*versions 1"):
        resolve("models:/traceops.composite/7", registered)

    empty = tmp_path / "empty-home"
    empty.mkdir()
    with pytest.raises(ConfigError, match="has no registry"):
        resolve("traceops.composite@champion", empty)
    # No spec and no registry: embedded, without creating a store in the home.
    assert resolve(None, empty) == ServeTarget(spec="embedded", kind="model", defaulted=True)
    assert not (empty / "mlflow").exists()
    with pytest.raises(ConfigError, match="--base-model applies to adapters and composites"):
        resolve(None, empty, base_model=str(tiny_model_dir))
    with pytest.raises(ConfigError, match="--base-model applies to adapters and composites"):
        resolve("embedded", empty, base_model=str(tiny_model_dir))
    # A registered version on another base than it was trained on: the weights hash check says so.
    with pytest.raises(ModelError, match="but the model was trained on"):
        resolve(f"{ADAPTER}/1", registered, base_model="embedded")


@pytest.mark.slow
def test_cli_serves_the_champion_over_http(registered: Path) -> None:
    """``traceops serve`` with no spec in a home with a champion: a real server process, the official
    ``openai`` client and traceops' own OpenAI-compatible client."""
    import openai

    port = _free_port()
    log = registered / "serve.log"
    env = {**os.environ, "TRACEOPS_HOME": str(registered)}
    with log.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "traceops", "serve", "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                models = httpx.get(f"{url}/v1/models", timeout=5).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(1)
        assert "serving traceops.composite version 1" in log.read_text()
        entry = models["data"][0]  # the default first, then its base and every registered adapter
        assert entry["id"] == registry.COMPOSITE_MODEL and entry["traceops_default"]
        assert entry["traceops_registered"]["name"] == registry.COMPOSITE_MODEL
        assert entry["traceops_registered"]["version"] == "1"
        assert f"+moe:{CAP}" in entry["traceops_model_id"] and entry["traceops_weights_hash"]
        official = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0)
        assert [m.id for m in official.models.list().data] == [m["id"] for m in models["data"]]
        assert ADAPTER in [m["id"] for m in models["data"]]
        reply = official.chat.completions.create(model="traceops.composite@champion", messages=CHAT,
                                                 tools=[WEATHER], max_tokens=4)
        assert reply.model == entry["id"] and reply.usage.completion_tokens >= 1
        assert reply.choices[0].message.role == "assistant"
        assert reply.system_fingerprint == entry["traceops_fingerprint"]
        assert reply.system_fingerprint.startswith(f"{registry.COMPOSITE_MODEL}/1:")
        client = load_model(f"{url}#{registry.COMPOSITE_MODEL}")
        assert client.info.weights_hash == entry["traceops_weights_hash"]
        assert len(client.generate([CHAT], [WEATHER], GenerationConfig(max_new_tokens=4))) == 1
        # Both exchanges went to the home's traffic log.
        logged = [line for f in (registered / "data" / "raw" / "served").glob("served-*.jsonl")
                  if not f.name.endswith(".outcomes.jsonl") for line in f.read_text().splitlines()]
        assert len(logged) == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)
