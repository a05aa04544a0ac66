"""Lineage audit over a real home: ingest (raw-file manifest) -> DVC-versioned curated data and
environments -> diagnosis and synthesize runs -> registered adapters -> router and composite; every link
resolved, raw files that moved are warnings, a deleted DVC object is a broken link."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import pytest
from random_adapters import random_adapter

from traceops import config, registry, versioning
from traceops.lineage import LineageError, current_lineage, lineage, raw_files_manifest, render_tree
from traceops.mlflow_models.registration import register_adapter, register_composite, register_router
from traceops.moe.build import build_moe
from traceops.moe.io import save_moe
from traceops.tags import TAG_DATA_VERSION, TAG_DIAGNOSIS_RUN, TAG_ENV_VERSION, TAG_RAW_FILES
from traceops.tasks.ingest import ingest_task
from traceops.tasks.tracking import stage_run

FIXTURES = Path(__file__).parent / "fixtures" / "formats" / "openai"
CAPABILITIES = ("state_tracking", "tool_selection")


@pytest.fixture(scope="module")
def night(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One night's artifacts, produced by the real stage code where it is cheap (ingest task, DVC,
    MLflow runs, registry) and hand-written environment files where synthesis would be slow."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("lineage")
    home = root / "home"
    raw = home / "data" / "raw" / "logs"
    raw.mkdir(parents=True)
    (home / "params.yaml").write_text("ingest:\n  workers: 1\n")
    for file in FIXTURES.iterdir():
        shutil.copy(file, raw / file.name)
    settings = config.load(home)
    paths = settings.paths

    ingest = ingest_task.fn([str(raw)], home=str(home))
    with stage_run(settings, "diagnose") as diagnose:
        mlflow.set_tag(TAG_DATA_VERSION, ingest.data_version)
    for cap in CAPABILITIES:
        folder = paths.environments / cap
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps({"capability": cap, "seed": 0}))
        (folder / "tasks.jsonl").write_text(json.dumps({"task_id": f"{cap}-0", "split": "test"}) + "\n")
    env_version = versioning.commit_data(home, "data/environments")
    with stage_run(settings, "synthesize"):
        mlflow.set_tag(TAG_ENV_VERSION, env_version)
        mlflow.set_tag(TAG_DIAGNOSIS_RUN, diagnose.info.run_id)

    tags = current_lineage(paths, str(tiny_model_dir))
    adapters, parents = {}, {}
    for seed, cap in enumerate(CAPABILITIES, start=1):
        adapters[cap] = random_adapter(tiny_model_dir, root / cap, seed)
        with stage_run(settings, "train"):
            ref = register_adapter(adapters[cap], cap, tags)
        parents[ref.name] = ref.version
    composite_dir = save_moe(build_moe(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)), adapters),
                             root / "composite")
    with stage_run(settings, "route"):
        router = register_router(composite_dir, tags, parents)
        composite = register_composite(composite_dir, tags, {**parents, router.name: router.version})
    registry.promote_aliases(composite.name, composite.version, promoted=True)
    return {"paths": paths, "raw": raw, "ingest": ingest, "diagnose_run": diagnose.info.run_id,
            "env_version": env_version, "tags": tags, "composite": composite, "router": router}


def nodes(tree: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield tree
    for child in tree["children"]:
        yield from nodes(child)


def test_ingest_records_a_raw_files_manifest(night: dict[str, Any]) -> None:
    run = mlflow.MlflowClient(night["paths"].mlflow_uri).get_run(night["ingest"].mlflow_run)
    expected = raw_files_manifest([night["raw"]], night["paths"].home)
    assert [e["path"] for e in expected] == [f"data/raw/logs/{f.name}" for f in sorted(FIXTURES.iterdir())]
    logged = json.loads(mlflow.artifacts.load_text(f"runs:/{run.info.run_id}/raw_files.json"))
    assert logged == expected
    assert run.data.tags[TAG_RAW_FILES] and run.data.tags[TAG_DATA_VERSION]


def test_champion_lineage_resolves_every_link(night: dict[str, Any]) -> None:
    result = lineage(night["paths"], "traceops.composite@champion")
    assert result["broken"] == [] and result["warnings"] == [] and result["ok"] is True
    assert result["version"]["version"] == night["composite"].version
    json.dumps(result)  # the CLI prints it as JSON
    listed = [n for n in nodes(result["tree"]) if not n.get("ref")]
    versions = {n["name"] for n in listed if n["kind"] == "model_version"}
    assert versions == {"traceops.composite/1", "traceops.router/1", "traceops.adapter.state_tracking/1",
                        "traceops.adapter.tool_selection/1"}
    envs = [n for n in listed if n["kind"] == "env_version" and n.get("files")]
    per_capability = {p["path"] for n in envs for p in n["files"]}
    assert {f"{c}/tasks.jsonl" for c in CAPABILITIES} <= per_capability
    assert {n["md5"] for n in envs} == {night["env_version"]}
    data = next(n for n in listed if n["kind"] == "data_version")
    assert data["md5"] == night["ingest"].data_version
    (ingest_run,) = data["children"]
    assert ingest_run["run_id"] == night["ingest"].mlflow_run
    assert sorted(f["path"] for f in ingest_run["children"]) == sorted(
        f"data/raw/logs/{f.name}" for f in FIXTURES.iterdir())
    assert all(f["status"] == "ok" for f in ingest_run["children"])
    runs = {n.get("run_id") for n in listed if n["kind"] == "run"}
    assert night["diagnose_run"] in runs and night["composite"].run_id in runs
    kinds = {n["kind"] for n in listed}
    assert {"git", "base_model", "artifacts"} <= kinds

    text = render_tree(result)
    assert text.splitlines()[0].endswith("all links verified")
    assert "✓ model_version traceops.composite/1" in text and "✗" not in text
    assert lineage(night["paths"], "traceops.composite/1")["ok"]


def test_moved_or_edited_raw_files_are_warnings(night: dict[str, Any]) -> None:
    files = sorted(night["raw"].iterdir())
    moved, edited = files[0], files[1]
    original = edited.read_bytes()
    shutil.move(moved, night["raw"].parent / moved.name)
    edited.write_bytes(original + b"\n")
    try:
        result = lineage(night["paths"], "traceops.composite@champion")
    finally:
        shutil.move(night["raw"].parent / moved.name, moved)
        edited.write_bytes(original)
    assert result["ok"] is True and result["broken"] == []
    assert len(result["warnings"]) == 2
    status = {n["path"]: n["status"] for n in nodes(result["tree"]) if n["kind"] == "raw_file"}
    assert status[f"data/raw/logs/{moved.name}"] == "missing"
    assert status[f"data/raw/logs/{edited.name}"] == "changed"
    assert "! raw_file" in render_tree(result) and "warning only" in result["warnings"][0]


def test_deleted_dvc_object_breaks_the_link(night: dict[str, Any]) -> None:
    home = night["paths"].home
    md5 = night["env_version"]
    stored = [home / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:],
              home / ".dvc-remote" / "files" / "md5" / md5[:2] / md5[2:]]
    saved = {path: path.read_bytes() for path in stored}
    for path in stored:
        path.unlink()
    try:
        result = lineage(night["paths"], "traceops.composite@champion")
    finally:
        for path, content in saved.items():
            path.write_bytes(content)
    assert result["ok"] is False
    assert result["broken"] and all(md5 in line for line in result["broken"])
    assert any(line.startswith("env_version") and "neither the cache nor the local remote" in line
               for line in result["broken"])
    assert "✗ env_version" in render_tree(result)
    assert lineage(night["paths"], "traceops.composite@champion")["ok"]  # restored: verified again


def test_unknown_model_or_alias_names_what_exists(night: dict[str, Any]) -> None:
    with pytest.raises(LineageError, match="has no alias 'nope'.*@champion"):
        lineage(night["paths"], "traceops.composite@nope")
    with pytest.raises(LineageError, match="registered models: .*traceops.composite"):
        lineage(night["paths"], "traceops.nothing@champion")
    with pytest.raises(LineageError, match="versions 1"):
        lineage(night["paths"], "traceops.composite/7")
