"""The bundled BFCL domain (data/public/bfcl): its files parse, its references are valid calls, its logs
ingest, and a night runs on it end to end (slow).

The fast tests read the bundled files as the stages do (the OpenAI reader, the outcomes reader, the
held-out reference-file reader) and check every reference call against its tool's JSON schema.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
import yaml
from test_nightly_run import cli, registered_versions, write_parameters

from traceops.evaluate import read_reports
from traceops.formats.openai import OpenAIReader
from traceops.formats.outcomes import load_outcomes
from traceops.heldout import is_heldout, load_references
from traceops.schema import Trajectory

ROOT = Path(__file__).resolve().parents[1]
BFCL = ROOT / "data" / "public" / "bfcl"
CATEGORIES = {"simple_python", "multiple", "parallel", "irrelevance"}
HELDOUT = 0.25  # share of the logged tasks the night holds out and replays (evaluate.requests)
PER_CATEGORY = 4  # logged records per category the tiny night reads


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize("folder", [BFCL, BFCL / "final_check"], ids=["dev", "final_check"])
def test_every_reference_is_a_schema_valid_call_of_its_request(folder: Path) -> None:
    requests = {row["task_id"]: row for row in read_jsonl(folder / "requests.jsonl")}
    references = load_references(folder / "references.jsonl")
    assert set(references) == set(requests)  # every request has a reference, and nothing else does
    assert {row["category"] for row in requests.values()} == CATEGORIES
    for task_id, replies in references.items():
        request = requests[task_id]
        tools = {tool["function"]["name"]: tool["function"]["parameters"] for tool in request["tools"]}
        for tool in request["tools"]:
            jsonschema.Draft202012Validator.check_schema(tool["function"]["parameters"])
            assert "." not in tool["function"]["name"]
        assert request["messages"] and request["messages"][-1]["role"] == "user"
        for reply in replies:
            if request["category"] == "irrelevance":
                assert not reply.tool_calls, task_id
                continue
            assert reply.tool_calls, task_id
            assert len(reply.tool_calls) > 1 or request["category"] != "parallel"
            for call in reply.tool_calls:
                assert call.raw_arguments is None
                jsonschema.validate(call.arguments, tools[call.name])  # raises with the field on failure


def test_dev_and_final_check_requests_are_disjoint() -> None:
    dev = {row["task_id"] for row in read_jsonl(BFCL / "requests.jsonl")}
    final = {row["task_id"] for row in read_jsonl(BFCL / "final_check" / "requests.jsonl")}
    assert dev and final and not dev & final


def test_bundled_logs_ingest_every_record_with_its_outcome() -> None:
    logs = BFCL / "logs" / "embedded.jsonl"
    requests = {row["task_id"]: row for row in read_jsonl(BFCL / "requests.jsonl")}
    logged = [row["task_id"] for row in read_jsonl(logs)]
    outcomes = load_outcomes(BFCL / "outcomes.jsonl")
    assert set(outcomes) == set(logged) <= set(requests) and len(set(logged)) == len(logged)
    assert {requests[task_id]["category"] for task_id in logged} == CATEGORIES
    items = list(OpenAIReader().read(logs, outcomes))
    trajectories = [item for item in items if isinstance(item, Trajectory)]
    assert len(trajectories) == len(items) == len(logged)  # nothing rejected
    for trajectory in trajectories:
        assert trajectory.domain == "bfcl"
        assert trajectory.tools and trajectory.messages[-1].role == "assistant"
        assert trajectory.outcome.success == outcomes[trajectory.task_id].success


def test_tool_selection_menus_are_no_longer_than_the_logged_requests_offer() -> None:
    """BFCL's requests offer 1 to 4 functions: native tool_selection tasks offer no more (an 8-tool menu
    only lengthens every row of a training batch), yet still offer several at the higher levels."""
    from dataclasses import replace

    from traceops.envs.families import FAMILIES
    from traceops.envs.grounding import build_grounding

    logs = BFCL / "logs" / "embedded.jsonl"
    trajectories = [t for t in OpenAIReader().read(logs, load_outcomes(BFCL / "outcomes.jsonl"))
                    if isinstance(t, Trajectory)]
    grounding = build_grounding(trajectories)
    assert grounding.max_menu == max(len(t.tools) for t in trajectories) == 4
    sizes = [len(t["tools"]) for t in FAMILIES["tool_selection"].generate(grounding, 0, 60)]
    assert max(sizes) == 4 and min(sizes) == 1
    unbounded = [len(t["tools"]) for t in FAMILIES["tool_selection"].generate(
        replace(grounding, max_menu=0), 0, 60)]
    assert max(unbounded) == 8  # without the logs' menus, level 3 offers 8


def first_per_category(folder: Path, n: int) -> tuple[Path, Path]:
    """The bundled logs' first ``n`` records of each category and their outcomes, written under ``folder``
    (the tiny night needs no more; the benchmark runs all of them)."""
    seen: dict[str, int] = {}
    rows = []
    for row in read_jsonl(BFCL / "logs" / "embedded.jsonl"):
        seen[row["metadata"]["category"]] = seen.get(row["metadata"]["category"], 0) + 1
        if seen[row["metadata"]["category"]] <= n:
            rows.append(row)
    kept = {row["task_id"] for row in rows}
    (folder / "logs").mkdir(parents=True)
    logs = folder / "logs" / "embedded.jsonl"
    logs.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    outcomes = folder / "outcomes.jsonl"
    outcomes.write_text("".join(json.dumps(row) + "\n" for row in read_jsonl(BFCL / "outcomes.jsonl")
                                if row["task_id"] in kept), encoding="utf-8")
    return logs.parent, outcomes


@pytest.mark.slow
def test_a_tiny_night_on_the_bfcl_logs(home: Path, tiny_model_dir: Path) -> None:
    """`traceops run --logs ... --outcomes ...` on the bundled BFCL logs (4 per category) with the tiny
    model: every record is ingested, diagnosis selects a capability, synthesis writes its environments,
    an adapter trains and registers, and evaluation runs."""
    write_parameters(home, tiny_model_dir)
    params = yaml.safe_load((home / "params.yaml").read_text())
    params["evaluate"]["requests"] = {"heldout_fraction": HELDOUT, "seed": 0,
                                      "references": str(BFCL / "references.jsonl")}
    (home / "params.yaml").write_text(yaml.safe_dump(params))
    logs, outcomes = first_per_category(home / "bfcl-sample", PER_CATEGORY)
    logged = [row["task_id"] for path in sorted(logs.glob("*.jsonl")) for row in read_jsonl(path)]
    held = [task_id for task_id in logged if is_heldout(task_id, 0, HELDOUT)]
    assert held  # the split must leave something to replay
    records = len(logged)
    code, night, err = cli(home, "run", "--logs", str(logs), "--outcomes", str(outcomes))
    assert code == 0, err
    curated = pd.read_parquet(home / "data" / "curated" / "trajectories.parquet")
    assert len(curated) == records and set(curated["domain"]) == {"bfcl"}  # every record accepted
    assert not list((home / "data" / "quarantine").glob("*.jsonl"))  # no quarantined record
    assert night["selected"], "diagnosis selected no capability"
    versions = registered_versions(home)
    failed = {row["task_id"] for row in read_jsonl(outcomes) if not row["success"]}
    asked = [row["request"]["messages"][-1]["content"] for path in sorted(logs.glob("*.jsonl"))
             for row in read_jsonl(path)
             if row["task_id"] in failed and not is_heldout(row["task_id"], 0, HELDOUT)]
    replayed = []
    for capability in night["selected"]:
        manifest = home / "data" / "environments" / capability / "manifest.json"
        assert manifest.is_file(), capability
        for split in ("train", "val", "test"):
            replayed += [row for row in read_jsonl(manifest.parent / f"{split}.jsonl") if row["gold"]["calls"]
                         and any(row["instruction"][:30] == text[:30] for text in asked)]
    # The agent got only declines right; the train side's references answer its failed requests, so
    # synthesis replays them, with the reference's calls as gold (traceops.reference_replies).
    assert asked and replayed
    trained = [c for c in night["selected"] if c not in night["deferred"]]
    assert trained and all(versions.get(f"traceops.adapter.{c}") == 1 for c in trained)
    # The held-out logged requests were replayed by every role and graded against the bundled references.
    reports, meta = read_reports(home / "data" / "eval" / "eval.json")
    assert meta["requests"]["replayed"] == {"bfcl": len(held)}
    assert sorted(s.task_id for s in reports["composite"].requests.scores) == sorted(held)
