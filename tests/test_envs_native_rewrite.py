"""`synthesize --llm URL#model`: a served writer model rewrites native requests; each rewrite is kept only
when every gold value survives it (issue 28, item 2). The writer is served by our own server (real
uvicorn, real HTTP) and reached through traceops.model.load_model's OpenAI-compatible client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from traceops.envs.family import task_id
from traceops.envs.rewrite import check_rewrite, gold_values
from traceops.envs.synthesize import SynthesisParams, synthesize
from traceops.formats.detect import iter_items
from traceops.model.base import GenerationConfig, ModelInfo
from traceops.serve import create_app

FIXTURE = Path(__file__).parent / "fixtures" / "unseen" / "calls.jsonl"


class Writer:
    """A writer whose rewrites are chosen by the request: a friendly prefix (keeps every value) for most,
    a paraphrase that loses the values for requests about heat, a tool name for court cases."""

    def __init__(self) -> None:
        self.info = ModelInfo(model_id="writer", weights_hash="0" * 64)
        self.prompts: list[list[dict[str, Any]]] = []

    def generate(self, conversations: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None = None,
                 config: GenerationConfig | None = None) -> list[str]:
        out = []
        for conversation in conversations:
            self.prompts.append(conversation)
            request = conversation[-1]["content"]
            if "heat" in request:
                out.append("Can you work out how much energy it takes to warm some water?")
            elif "case" in request:
                out.append(f"Use get_case_details: {request}")
            else:
                out.append(f'"Hi there! {request}"')
        return out


@pytest.fixture(scope="module")
def writer_url():
    from test_serve import running

    writer = Writer()
    with running(create_app(writer)) as url:
        yield f"{url}#writer", writer


def test_rewrites_are_kept_only_when_every_value_survives(tmp_path, writer_url):
    url, writer = writer_url
    logs = list(iter_items([FIXTURE]))
    params = SynthesisParams(train_size=16, val_size=4, test_size=4, llm=url)
    result = synthesize(["tool_selection", "irrelevance_refusal"], logs, tmp_path, params, seed=1)
    assert result.passed
    manifest = json.loads((tmp_path / "tool_selection" / "manifest.json").read_text())
    stats = manifest["rewrites"]
    asked = [json.loads(line) for split in ("train", "val", "test")
             for line in (tmp_path / "tool_selection" / f"{split}.jsonl").read_text().splitlines()]
    # every request with a gold call is sent to the writer; those no offered tool serves keep their text
    assert stats["writer"] == url and stats["asked"] == sum(bool(t["gold"]["calls"]) for t in asked) >= 16
    assert stats["kept"] > 0 and stats["kept"] + sum(stats["kept_offline"].values()) == stats["asked"]
    assert stats["kept_offline"].get("value missing", 0) > 0
    assert stats["kept_offline"].get("names a tool or parameter", 0) > 0
    assert manifest["parameters"]["llm"] == url
    tasks = [json.loads(line) for split in ("train", "val", "test")
             for line in (tmp_path / "tool_selection" / f"{split}.jsonl").read_text().splitlines()]
    rewritten = [t for t in tasks if t.get("written_by") == "llm"]
    assert len(rewritten) == stats["kept"]
    for task in rewritten:
        assert task["instruction"].startswith("Hi there! ") and task["task_id"] == task_id(task)
        assert all(v in task["instruction"] for v in gold_values(task))
    assert not any("heat" in t["instruction"] and t.get("written_by") for t in tasks)
    # the writer saw the request as the user turn and the values to keep in its instructions
    assert writer.prompts and all(p[0]["role"] == "system" and p[1]["role"] == "user" for p in writer.prompts)
    refusals = json.loads((tmp_path / "irrelevance_refusal" / "manifest.json").read_text())["rewrites"]
    assert refusals["asked"] == 0  # no value can show a rewrite still asks for what no tool does


def test_check_rewrite_rules():
    task = {"instruction": "How much heat for 2.5 kg from 290K to 330K?",
            "tools": [{"type": "function", "function": {"name": "calculate_heat", "parameters": {
                "type": "object", "properties": {"initial_temp": {"type": "integer"}}}}}],
            "gold": {"calls": [{"name": "calculate_heat",
                                "arguments": {"mass": 2.5, "initial_temp": 290, "final_temp": 330}}]}}
    assert check_rewrite(task, "I've got 2.5 kg of water at 290K; what does it take to reach 330K?") is None
    assert check_rewrite(task, "I've got 2.5 kg of water at 2900K going to 330K") == "value missing"
    assert check_rewrite(task, "calculate_heat for 2.5 kg, 290K to 330K") == "names a tool or parameter"
    assert check_rewrite(task, "initial_temp 290, 2.5 kg, 330K") == "names a tool or parameter"
    assert check_rewrite(task, '<tool_call>{"name": "x"}</tool_call> 2.5 290 330') == "markup"
    assert check_rewrite(task, "   ") == "empty"
    # SmolLM2-135M's rewrite of a BFCL-like request: every value kept, the request itself lost
    assert check_rewrite(task, "The water is 2.5 kg, it starts at 290K and ends at 330K.") == "asks nothing"
    assert check_rewrite(task, "Calculate the heat for 2.5 kg of water going from 290K to 330K.") is None
    assert check_rewrite(task, "2.5 290 330 " + "very " * 60) == "too long"
