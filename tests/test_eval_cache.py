"""The evaluation cache: a second evaluation of the same weights on the same tasks reads every part
(held-out split per capability, replay of logged failures, replies to held-out real requests) and gives
the same results without loading the model; a changed task or changed weights miss. Real tiny Llama,
real synthesized environments, model calls counted on the real model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from random_adapters import random_adapter
from test_evaluate_requests import ALL, TIME, logged

from traceops.evaluation.cache import EvalCache, role_weights_id
from traceops.evaluation.requests import select_requests
from traceops.evaluation.stage import (
    EvalParams,
    RoleSpec,
    evaluate_roles,
    load_role_model,
    scored_capabilities,
)
from traceops.graders import load_grader

CAPS = ["argument_grounding", "tool_call_format"]
PARAMS = EvalParams.from_params({"limit": 2, "max_new_tokens": 6, "max_turns": 2, "replay_max_turns": 2,
                                 "batch_size": 2, "replay_roles": ["base"]})


@pytest.fixture(scope="module")
def world(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from traceops.envs.synthesize import synthesize

    root = tmp_path_factory.mktemp("eval-cache")
    envs = root / "environments"
    assert synthesize(CAPS, [], envs, {"train_size": 2, "val_size": 1, "test_size": 3}).passed
    adapters = {seed: random_adapter(tiny_model_dir, root / f"adapter-{seed}", seed) for seed in (1, 2)}
    trajectories = [logged("r1"), logged("r2", city="Rome"), logged("r3", tools=[TIME])]
    return {"root": root, "envs": envs, "adapters": adapters, "requests": select_requests(trajectories, ALL)}


class Counted:
    """Loads each role's real model and counts the loads and the ``generate`` calls made on them."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir, self.loads, self.calls = base_dir, 0, 0

    def __call__(self, spec: RoleSpec) -> Any:
        model = load_role_model(spec, self.base_dir, PARAMS.batch_size)
        self.loads += 1
        generate = model.generate

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return generate(*args, **kwargs)

        model.generate = counted  # type: ignore[method-assign]
        return model


def evaluate(world: dict[str, Any], base_dir: Path, specs: list[RoleSpec], cache_dir: Path | None,
             envs: Path | None = None) -> tuple[dict, Counted, EvalCache]:
    counted, cache = Counted(base_dir), EvalCache(cache_dir)
    graders = {"weather": load_grader("tool_call_match")}
    reports, _ = evaluate_roles(specs, base_dir, envs or world["envs"], CAPS, PARAMS, domain="retail",
                                failed=[("retail-0003", "policy_adherence")], load=counted,
                                requests=world["requests"], graders=graders, cache=cache)
    return reports, counted, cache


def test_a_second_evaluation_reads_the_cache_and_gives_the_same_results(world: dict[str, Any],
                                                                        tiny_model_dir: Path,
                                                                        tmp_path: Path) -> None:
    adapter = str(world["adapters"][1])
    specs = [RoleSpec("base", "base"),
             RoleSpec("adapter:tool_call_format", "adapter", adapter, None, "tool_call_format")]
    first, counted, cache = evaluate(world, tiny_model_dir, specs, tmp_path / "cache")
    assert counted.loads == 2 and counted.calls > 0 and cache.hits == 0
    again, counted, cache = evaluate(world, tiny_model_dir, specs, tmp_path / "cache")
    assert counted.loads == 0 and counted.calls == 0 and cache.misses == 0 and cache.hits > 0
    for role in first:
        assert again[role].details() == first[role].details()
        assert sorted(again[role].envs.capabilities) == CAPS
        assert all(c.n_tasks == 2 for c in again[role].envs.capabilities.values())
        assert again[role].requests.graded() == 3
    assert again["base"].replay.replayed == 1 and again["adapter:tool_call_format"].replay is None


def test_a_changed_task_or_model_misses(world: dict[str, Any], tiny_model_dir: Path, tmp_path: Path) -> None:
    import shutil

    base = [RoleSpec("base", "base")]
    first, _, _ = evaluate(world, tiny_model_dir, base, tmp_path / "cache")
    # One task of one capability changes: only that capability is scored again, the rest is read.
    envs = tmp_path / "environments"
    shutil.copytree(world["envs"], envs)
    split = envs / "tool_call_format" / "test.jsonl"
    rows = [json.loads(line) for line in split.read_text().splitlines() if line.strip()]
    rows[0]["task_id"] = "changed-task"
    split.write_text("".join(json.dumps(r) + "\n" for r in rows))
    changed, counted, cache = evaluate(world, tiny_model_dir, base, tmp_path / "cache", envs=envs)
    assert counted.loads == 1 and cache.misses == 1  # tool_call_format's split; the rest hit
    assert "changed-task" in changed["base"].envs.capabilities["tool_call_format"].rewards
    assert (changed["base"].envs.capabilities["argument_grounding"]
            == first["base"].envs.capabilities["argument_grounding"])
    # Other weights: nothing of the first adapter's is reused for the second.
    one = RoleSpec("adapter:x", "adapter", str(world["adapters"][1]), None, "tool_call_format")
    two = RoleSpec("adapter:x", "adapter", str(world["adapters"][2]), None, "tool_call_format")
    evaluate(world, tiny_model_dir, [one], tmp_path / "cache")
    _, counted, cache = evaluate(world, tiny_model_dir, [two], tmp_path / "cache")
    assert counted.loads == 1 and cache.hits == 0
    assert role_weights_id("adapter", one.path, "w") != role_weights_id("adapter", two.path, "w")
    assert role_weights_id("adapter", one.path, "w") != role_weights_id("adapter", one.path, "other base")


def test_only_the_capabilities_with_an_adapter_tonight_are_scored() -> None:
    specs = [RoleSpec("base", "base"), RoleSpec("adapter:a", "adapter", "/a", None, "a"),
             RoleSpec("composite", "composite", "/c")]
    scored, skipped = scored_capabilities(specs, ["a", "b", "c"], {"b": "does not fit the time budget"})
    assert scored == ["a"]
    assert skipped == {"b": "no adapter tonight (does not fit the time budget)",
                       "c": "no adapter tonight (not trained)"}
    # No adapter at all (the base alone, or a composite from the registry): every environment is scored.
    assert scored_capabilities(specs[:1], ["a", "b"]) == (["a", "b"], {})


def test_the_report_lists_what_was_not_evaluated(tmp_path: Path) -> None:
    from traceops.evaluation.html import render_eval_html
    from traceops.evaluation.metrics import CapabilityEval, EnvEval
    from traceops.evaluation.report import EvalReport

    envs = EnvEval(model_id="m", split="test", k=1, trials=1, temperature=0.0, seed=0,
                   capabilities={"a": CapabilityEval("a", {"t1": [1.0], "t2": [0.0]})})
    page = render_eval_html({"base": EvalReport("base", "m", envs=envs)}, tmp_path / "report.html",
                            not_evaluated={"b": "no adapter tonight (over the budget)"}).read_text()
    assert "Not evaluated: b: no adapter tonight (over the budget)." in page
