"""Registry: adapters and composites as MLflow pyfunc versions with lineage tags, idempotent per run and
per registration key, aliases moved by promotion, abandoned runs closed, registered versions that load and
generate like the models they hold, and modules that import one way only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pytest
from random_adapters import random_adapter

from traceops import config, registry
from traceops.errors import ConfigError, InputError
from traceops.hashing import folder_hash
from traceops.lineage import current_lineage
from traceops.mlflow_models.registration import (
    register_adapter,
    register_composite,
    register_once,
    register_router,
)
from traceops.model.base import GenerationConfig
from traceops.model.reference import resolve_base_model
from traceops.tags import (
    LINEAGE_KEYS,
    TAG_ADAPTER_HASH,
    TAG_BASE_MODEL,
    TAG_BASE_SPEC,
    TAG_CAPABILITY,
    TAG_ENV_VERSION,
    TAG_PARENT_VERSIONS,
    TAG_SOURCE_RUN,
    TAG_TRAIN_KEY,
)
from traceops.tasks.tracking import stage_run


def make_composite(base_dir: Path, adapters: dict[str, Path], out: Path) -> Path:
    """A stacked MoE-LoRA over ``adapters`` on the tiny base, saved with save_moe."""
    from transformers import AutoModelForCausalLM

    from traceops.moe.build import build_moe
    from traceops.moe.io import save_moe

    base = AutoModelForCausalLM.from_pretrained(str(base_dir))
    return save_moe(build_moe(base, adapters, top_k=2), out)


@pytest.fixture(scope="module")
def setup(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A home with two adapters and one composite on the tiny base (files only, nothing registered)."""
    root = tmp_path_factory.mktemp("registry")
    home = root / "home"
    home.mkdir()
    adapters = {cap: random_adapter(tiny_model_dir, root / cap, seed)
                for seed, cap in enumerate(["tool_selection", "state_tracking"], start=1)}
    composite = make_composite(tiny_model_dir, adapters, root / "composite")
    return {"home": home, "settings": config.load(home), "adapters": adapters, "composite": composite,
            "base": tiny_model_dir}


def _lineage(setup: dict[str, Any]) -> dict[str, str]:
    return current_lineage(setup["settings"].paths, str(setup["base"]), diagnosis_run="")


def test_adapter_registers_once_per_run_with_lineage_tags(setup: dict[str, Any]) -> None:
    settings = setup["settings"]
    lineage = _lineage(setup)
    with stage_run(settings, "train") as run:
        ref = register_adapter(setup["adapters"]["tool_selection"], "tool_selection", lineage)
        again = register_adapter(setup["adapters"]["tool_selection"], "tool_selection", lineage)
    assert ref == again == registry.ModelRef("traceops.adapter.tool_selection", "1", run.info.run_id)
    tags = registry.version_tags(ref)
    assert {k: tags[k] for k in LINEAGE_KEYS} == lineage
    assert tags[TAG_SOURCE_RUN] == run.info.run_id
    assert tags[TAG_CAPABILITY] == "tool_selection"
    assert tags[TAG_BASE_SPEC] == str(setup["base"])  # a local base stays a folder spec

    # A resumed run (same run id) registers nothing new; a new run makes version 2.
    with mlflow.start_run(run_id=run.info.run_id):
        resumed = register_adapter(setup["adapters"]["tool_selection"], "tool_selection", lineage)
    assert resumed == ref
    with stage_run(settings, "train") as second:
        ref2 = register_adapter(setup["adapters"]["tool_selection"], "tool_selection", lineage)
    assert ref2.version == "2" and ref2.run_id == second.info.run_id
    assert registry.latest_version("traceops.adapter.tool_selection") == ref2
    assert registry.latest_version("traceops.adapter.nothing_here") is None
    assert ref.uri == "models:/traceops.adapter.tool_selection/1"
    assert ref.as_dict()["uri"] == ref.uri

    downloaded = registry.download(ref, Path(setup["home"]) / "dl")
    assert (downloaded / "adapter_config.json").is_file()
    assert folder_hash(downloaded) == folder_hash(setup["adapters"]["tool_selection"])
    # The home's one download cache: models/registry/<name>/<version>.
    cached = registry.download_version(settings.paths, ref)
    assert cached.is_relative_to(settings.paths.models / "registry" / ref.name / "1")
    assert folder_hash(cached) == folder_hash(downloaded)


def test_bad_registrations_say_what_to_do(setup: dict[str, Any]) -> None:
    registry.configure(setup["settings"].paths)
    lineage = _lineage(setup)
    with pytest.raises(ConfigError, match="active MLflow run"):
        register_adapter(setup["adapters"]["tool_selection"], "tool_selection", lineage)
    with stage_run(setup["settings"], "train"):
        with pytest.raises(ConfigError, match="lineage lacks traceops.env_version"):
            register_adapter(setup["adapters"]["tool_selection"], "tool_selection",
                             {k: v for k, v in lineage.items() if k != TAG_ENV_VERSION})
        with pytest.raises(ConfigError, match="snake_case"):
            register_adapter(setup["adapters"]["tool_selection"], "Tool Selection", lineage)
        with pytest.raises(ConfigError, match="not a PEFT adapter"):
            register_adapter(setup["composite"], "tool_selection", lineage)
        wrong_base = {**lineage, TAG_BASE_MODEL: "other@" + "0" * 64}
        with pytest.raises(ConfigError, match="lineage says other@"):
            register_adapter(setup["adapters"]["tool_selection"], "tool_selection", wrong_base)
        with pytest.raises(ConfigError, match="parent_versions"):
            register_composite(setup["composite"], lineage, {})


def test_aliases_follow_promotion(setup: dict[str, Any]) -> None:
    settings = setup["settings"]
    lineage = _lineage(setup)
    name = registry.adapter_model_name("state_tracking")
    refs = []
    for _ in range(3):
        with stage_run(settings, "train"):
            refs.append(register_adapter(setup["adapters"]["state_tracking"], "state_tracking", lineage))
    assert [r.version for r in refs] == ["1", "2", "3"]

    first = registry.promote_aliases(name, "1", promoted=True)  # first night: no champion before
    assert (first["alias"], first["previous"], first["aliases"]) == ("champion", None, {"champion": "1"})
    challenger = registry.promote_aliases(name, "2", promoted=False)
    assert challenger["alias"] == "challenger"
    assert challenger["aliases"] == {"champion": "1", "challenger": "2"}
    moved = registry.promote_aliases(name, "2", promoted=True)
    assert moved["previous"] == "1"
    assert moved["aliases"] == {"champion": "2", "previous": "1"}  # the promoted challenger is no longer one
    assert registry.promote_aliases(name, "2", promoted=True)["aliases"] == {"champion": "2", "previous": "1"}
    registry.promote_aliases(name, "3", promoted=True)
    assert registry.get_alias(name, "champion") == refs[2]
    assert registry.get_alias(name, "previous") == refs[1]
    assert registry.resolve_ref(f"models:/{name}@previous") == refs[1]
    assert registry.resolve_ref(f"{name}/1") == refs[0]

    registry.set_alias(name, "canary", "1")
    assert registry.get_alias(name, "canary") == refs[0]
    assert registry.get_alias(name, "nope") is None
    assert registry.get_alias("traceops.unknown", "champion") is None
    with pytest.raises(ConfigError, match="versions 1, 2, 3"):
        registry.set_alias(name, "canary", "9")
    with pytest.raises(ConfigError, match="has no alias 'nope'"):
        registry.resolve_ref(f"{name}@nope")
    with pytest.raises(ConfigError, match="registered models: .*traceops.adapter.state_tracking"):
        registry.resolve_ref("traceops.unknown/1")


def test_registered_versions_load_and_generate_like_their_folders(setup: dict[str, Any]) -> None:
    from traceops.model.adapted import load_adapter_model, load_composite_model

    settings = setup["settings"]
    lineage = _lineage(setup)
    with stage_run(settings, "train"):
        adapter = register_adapter(setup["adapters"]["tool_selection"], "tool_selection", lineage)
    parents = {"traceops.adapter.tool_selection": adapter.version, "traceops.adapter.state_tracking": "1"}
    with stage_run(settings, "route") as run:
        router = register_router(setup["composite"], lineage, parents)
        composite = register_composite(setup["composite"], lineage,
                                       {**parents, registry.ROUTER_MODEL: router.version})
        assert register_composite(setup["composite"], lineage, parents) == composite
    assert (router.name, composite.name) == ("traceops.router", "traceops.composite")
    assert router.run_id == composite.run_id == run.info.run_id
    tags = registry.version_tags(composite)
    assert json.loads(tags[TAG_PARENT_VERSIONS]) == {**parents, "traceops.router": router.version}
    # Router and composite share one logged model: the folder is stored once per run.
    client = mlflow.MlflowClient()
    assert client.get_model_version(router.name, router.version).source == \
        client.get_model_version(composite.name, composite.version).source
    registry.promote_aliases(composite.name, composite.version, promoted=True)

    tools = [{"type": "function", "function": {"name": "get_order", "description": "Look up an order",
                                                "parameters": {"type": "object", "properties": {
                                                    "order_id": {"type": "string"}}}}}]
    conversations = [[{"role": "user", "content": "Where is order 7?"}],
                     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                      {"role": "user", "content": "Cancel order 9"}]]
    frame = pd.DataFrame({"messages": [json.dumps(c) for c in conversations],
                          "tools": [json.dumps(tools), None]})
    gen = GenerationConfig(max_new_tokens=6)

    served = mlflow.pyfunc.load_model("models:/traceops.composite@champion")
    out = list(served.predict(frame, params={"max_new_tokens": 6}))
    direct = load_composite_model(setup["base"], setup["composite"])
    assert out == [direct.generate([conversations[0]], tools, gen)[0],
                   direct.generate([conversations[1]], None, gen)[0]]
    assert all(isinstance(text, str) and text for text in out)

    adapter_model = mlflow.pyfunc.load_model(adapter.uri)
    adapter_out = list(adapter_model.predict(frame.iloc[:1], params={"max_new_tokens": 6}))
    plain = load_adapter_model(setup["base"], setup["adapters"]["tool_selection"])
    assert adapter_out == plain.generate([conversations[0]], tools, gen)

    with pytest.raises(InputError, match="messages"):
        served.predict(pd.DataFrame({"messages": ['{"role": "user"}']}))


def test_pyfunc_refuses_a_base_model_with_other_weights(tiny_model_dir: Path) -> None:
    from traceops.errors import ModelError
    from traceops.mlflow_models import base_model_dir

    _folder, ref = resolve_base_model(str(tiny_model_dir))
    assert base_model_dir({"base_model": str(tiny_model_dir), "base_model_ref": ref}) == tiny_model_dir
    with pytest.raises(ModelError, match="was trained on other@"):
        base_model_dir({"base_model": str(tiny_model_dir), "base_model_ref": "other@" + "0" * 64})


def test_register_once_per_key_across_runs(setup: dict[str, Any]) -> None:
    """A rerun (a new run) with the same key finds the version instead of registering a second one."""
    settings = setup["settings"]
    lineage = _lineage(setup)
    folder = setup["adapters"]["state_tracking"]
    name, digest = registry.adapter_model_name("state_tracking"), folder_hash(folder)

    def register(tags: dict[str, str]) -> registry.ModelRef:
        return register_adapter(folder, "state_tracking", lineage, extra_tags=tags)

    with stage_run(settings, "train") as run:
        ref, existed = register_once(name, TAG_ADAPTER_HASH, digest, register)
    assert not existed and ref.run_id == run.info.run_id
    assert registry.version_tags(ref)[TAG_ADAPTER_HASH] == digest
    with stage_run(settings, "train"):
        again, existed = register_once(name, TAG_ADAPTER_HASH, digest, register)
    assert existed and again == ref
    assert registry.find_tagged_version(name, TAG_ADAPTER_HASH, "no-such-hash") is None


def test_kill_running_runs_closes_only_what_it_selects(setup: dict[str, Any], tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    fresh = config.load(tmp_path).paths
    assert registry.kill_running_runs(fresh) == [] and not fresh.mlflow.exists()  # no store: none made

    paths = setup["settings"].paths
    registry.configure(paths)
    client = MlflowClient(paths.mlflow_uri, paths.mlflow_uri)
    train, ingest = registry.ensure_experiment(paths, "train"), registry.ensure_experiment(paths, "ingest")
    own, abandoned, other_key, other_stage = (
        client.create_run(experiment, tags={TAG_TRAIN_KEY: key}).info.run_id
        for experiment, key in ((train, "k"), (train, "k"), (train, "j"), (ingest, "k")))
    assert registry.kill_running_runs(paths, "train", (TAG_TRAIN_KEY, "k"), keep=own) == [abandoned]
    runs = (own, abandoned, other_key, other_stage)
    statuses = [client.get_run(run_id).info.status for run_id in runs]
    assert statuses == ["RUNNING", "KILLED", "RUNNING", "RUNNING"]
    assert set(registry.kill_running_runs(paths)) == {own, other_key, other_stage}  # under the home lock
    assert registry.kill_running_runs(paths) == []


def test_modules_import_one_way() -> None:
    """tags imports nothing of traceops; the registry never imports the pyfunc models or the lineage."""
    import subprocess
    import sys

    code = ("import sys, traceops.tags, traceops.registry; "
            "print(sorted(m for m in sys.modules if m.startswith('traceops.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "traceops.mlflow_models" not in loaded and "traceops.lineage" not in loaded
    code = "import sys, traceops.tags; print(sorted(m for m in sys.modules if m.startswith('traceops')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['traceops', 'traceops.tags']"
