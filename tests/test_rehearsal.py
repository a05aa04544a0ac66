"""Rehearsal: adapters also train on the agent's own logged successes (train side of the held-out split),
rendered exactly as the served model is prompted; the draw is part of the training cache key and of the
adapter's record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from traceops.errors import ConfigError
from traceops.heldout import is_heldout, request_step
from traceops.schema import Message, Outcome, Source, ToolCall, ToolSpec, Trajectory
from traceops.train.rehearsal import (
    CALLS,
    NO_CALL,
    build_rehearsal,
    draw_rehearsal,
    eligible_trajectories,
    rehearsal_count,
    rehearsal_row,
    reply_kind,
)

SYSTEM = "You are the support agent of a shop. Unrelated requests (weather, jokes): decline, call no tool."
SPEC = {"type": "object", "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"}},
        "required": ["order_id", "reason"]}
TOOLS = [ToolSpec(name="cancel_pending_order", description="Cancel a pending order", parameters=SPEC),
         ToolSpec(name="get_order_details", description="Read an order",
                  parameters={"type": "object", "properties": {"order_id": {"type": "string"}},
                              "required": ["order_id"]})]


def run(index: int, success: bool = True, decline: bool = False, domain: str = "shop",
        system: bool = True, record: int = 0) -> Trajectory:
    """A logged run: a decline of an unrelated request, or look-up, cancel and a closing answer."""
    order = f"#W{2000000 + index:07d}"
    head = [Message(role="system", content=SYSTEM)] if system else []
    if decline:
        body = [Message(role="user", content=f"What's the weather in city {index}?"),
                Message(role="assistant", content="Sorry, I can only help with orders from this shop.")]
    else:
        body = [Message(role="user", content=f"Please cancel my order {order}, I ordered it by mistake."),
                Message(role="assistant", tool_calls=[ToolCall(id="a", name="get_order_details",
                                                               arguments={"order_id": order})]),
                Message(role="tool", tool_call_id="a", content=json.dumps({"status": "pending"})),
                Message(role="assistant", tool_calls=[ToolCall(
                    id="b", name="cancel_pending_order",
                    arguments={"order_id": order, "reason": "ordered by mistake"})]),
                Message(role="tool", tool_call_id="b", content="cancelled"),
                Message(role="assistant", content=f"Order {order} is cancelled.")]
    return Trajectory(task_id=f"t{index}", domain=domain, tools=TOOLS, messages=head + body,
                      outcome=Outcome(success=success),
                      source=Source(format="openai", file="logs.jsonl", record=index * 10 + record))


def logs(n: int = 60) -> list[Trajectory]:
    """Successes (one in five a decline), failures, another domain's success and a task's second run."""
    out = [run(i, decline=i % 5 == 0) for i in range(n)]
    out += [run(i, success=False, record=1) for i in range(n, n + 10)]
    out += [run(n + 20, domain="other"), run(3, record=2, system=False)]
    return out


def test_eligible_runs_are_train_side_successes_of_the_domain_one_per_task() -> None:
    trajectories = logs()
    eligible = eligible_trajectories(trajectories, seed=0, fraction=0.2, domains=["shop"])
    ids = {t.task_id for t in eligible}
    held = {t.task_id for t in trajectories if is_heldout(t.task_id, 0, 0.2)}
    assert held and not ids & held  # a held-out task is never rehearsed
    assert len(ids) == len(eligible)  # one run per task
    assert all(t.outcome.succeeded and t.domain == "shop" for t in eligible)
    assert ids == {t.task_id for t in trajectories if t.outcome.succeeded and t.domain == "shop"} - held
    if "t3" in ids:  # two successful runs: the lower id, whatever the log order
        assert next(t for t in eligible if t.task_id == "t3").id == min(
            t.id for t in trajectories if t.task_id == "t3" and t.outcome.succeeded)
    assert {t.domain for t in eligible_trajectories(trajectories, 0, 0.2)} == {"shop", "other"}
    assert eligible_trajectories(trajectories, 0, 0.99, ["shop"]) != eligible


def test_draw_meets_the_share_and_keeps_the_rare_reply_kind() -> None:
    assert rehearsal_count(0.25, 30, 100) == 10 and rehearsal_count(0.25, 300, 7) == 7
    assert rehearsal_count(0.0, 30, 100) == 0 and rehearsal_count(0.5, 0, 100) == 0
    eligible = eligible_trajectories(logs(), 0, 0.2, ["shop"])
    declines = [t for t in eligible if reply_kind(t) == NO_CALL]
    assert declines and len(declines) < len(eligible) / 3
    picked = draw_rehearsal(eligible, 0.25, 18, seed=0)
    assert len(picked) == 6 and len({t.id for t in picked}) == 6
    kinds = [reply_kind(t) for t in picked]
    assert kinds.count(NO_CALL) == 3 and kinds.count(CALLS) == 3  # alternating, not 1 in 5 by chance
    assert draw_rehearsal(list(reversed(eligible)), 0.25, 18, seed=0) == picked  # order-free
    assert draw_rehearsal(eligible, 0.25, 18, seed=1) != picked
    assert len(draw_rehearsal(eligible, 0.9, 1000, seed=0)) == len(eligible)


def test_rows_render_the_served_prompt_and_keep_whole_turns(tiny_model_dir: Path) -> None:
    """A row's text up to its request turn is the prompt the served adapter gets for that logged request
    (TrainedChatModel.prompt), with the logged system prompt and tools; the loss starts right after it;
    a row cut to fit keeps whole assistant turns and never less than the request turn."""
    from traceops.model.adapted import training_conversation
    from traceops.model.chat_template import DEFAULT_SYSTEM_PROMPT, load_tokenizer
    from traceops.model.toolcalls import render_prompt
    from traceops.train.sft import assistant_mask

    tokenizer = load_tokenizer(str(tiny_model_dir))
    for trajectory in (run(1), run(5, decline=True), run(2, system=False)):
        row, tokens = rehearsal_row(trajectory, tokenizer, max_length=100_000)
        step = request_step(trajectory)
        served = render_prompt(tokenizer, training_conversation(trajectory.messages[:step]), trajectory.tools)
        tools = json.loads(row["tools"])
        shift = 0 if trajectory.messages[0].role == "system" else 1
        prefix = row["messages"][:step + shift]
        assert tokenizer.apply_chat_template(prefix, tools=tools, tokenize=False,
                                             add_generation_prompt=True) == served
        assert (SYSTEM if shift == 0 else DEFAULT_SYSTEM_PROMPT) in served
        assert "cancel_pending_order" in served.split("<|im_end|>")[0]  # the logged tools, natively
        ids, mask = assistant_mask(tokenizer, row["messages"], tools)
        served_ids = tokenizer(served, add_special_tokens=False)["input_ids"]
        assert ids[:len(served_ids)] == served_ids and mask.index(1) == len(served_ids) - 1
        assert len(ids) == tokens
        assert len(row["messages"]) == len(trajectory.messages) + shift  # it fits: the whole run
    whole = run(1)
    request, _ = rehearsal_row(whole, tokenizer, max_length=10)  # nothing fits: the request turn stays
    assert [m["role"] for m in request["messages"]] == ["system", "user", "assistant"]
    assert request["messages"][-1]["content"].startswith('<tool_call>{"name": "get_order_details"')
    full, full_tokens = rehearsal_row(whole, tokenizer, max_length=100_000)
    middle, middle_tokens = rehearsal_row(whole, tokenizer, max_length=full_tokens - 1)
    assert middle["messages"] == full["messages"][:5] and middle_tokens < full_tokens
    rehearsal = build_rehearsal([run(1), run(5, decline=True)], 0.25, 9, tokenizer, 100_000)
    record = rehearsal.identity()
    assert record["by_kind"] == {NO_CALL: 1, CALLS: 1} and record["available"] == 9
    assert record["trajectory_ids"] == [run(1).id, run(5, decline=True).id]
    assert record["max_tokens"] == max(rehearsal.tokens) and len(record["hash"]) == 16
    assert build_rehearsal([run(1)], 0.25, 9, tokenizer, 100_000).content_hash != record["hash"]


def test_sft_rows_lengthen_for_rehearsal_and_checkpoint_when_memory_needs_it(tiny_model_dir: Path) -> None:
    from dataclasses import replace

    from traceops.train.budgets import BUDGETS, GIB
    from traceops.train.rehearsal import Rehearsal, sft_budget

    small = BUDGETS["small"]
    sizes = {"n_params": 134_515_008, "trainable": 4_884_480, "hidden": 576, "layers": 30, "heads": 9,
             "vocab": 49_152, "eager_attention": 0}  # SmolLM2-135M with LoRA r=16 on all projections
    long = Rehearsal(share=0.25, rows=[{"messages": [], "tools": "[]"}], tokens=[2452])
    short = Rehearsal(share=0.25, rows=[{"messages": [], "tools": "[]"}], tokens=[900])
    assert sft_budget(small, 0, sizes) is small and sft_budget(small, short.max_tokens, sizes) is small
    roomy = sft_budget(small, long.max_tokens, sizes, available=64 * GIB)
    assert roomy == replace(small, sft_max_length=2452) and not roomy.sft_checkpointing
    tight = sft_budget(small, long.max_tokens, sizes, available=10 * GIB)  # ~16 GiB unchecked, ~7 with
    assert tight.sft_max_length == 2452 and tight.sft_checkpointing and tight.grpo_steps == small.grpo_steps
    with pytest.raises(ConfigError, match="GiB"):
        sft_budget(small, long.max_tokens, sizes, available=2 * GIB)


def test_rehearsal_share_is_validated(home: Path) -> None:
    from traceops import config

    assert config.rehearsal_share(config.load(home)) == config.REHEARSAL_SHARE
    for bad in (1, 1.5, -0.1, True, "a lot"):
        (home / "params.yaml").write_text(yaml.safe_dump({"train": {"rehearsal_share": bad}}))
        with pytest.raises(ConfigError, match="train.rehearsal_share"):
            config.rehearsal_share(config.load(home))
    (home / "params.yaml").write_text(yaml.safe_dump({"train": {"rehearsal_share": 0}}))
    assert config.rehearsal_share(config.load(home)) == 0.0


@pytest.mark.slow
def test_adapter_rehearses_the_drawn_logs_and_the_key_names_them(home: Path, tiny_model_dir: Path) -> None:
    """Store -> draw (domain of the environments, train side) -> key -> rows -> a tiny adapter whose
    config records what it rehearsed and whose SFT rows were lengthened, not cut, to hold them."""
    from dataclasses import replace

    from traceops import config
    from traceops.envs.synthesize import synthesize
    from traceops.flows.train import adapter_key
    from traceops.store import append_trajectories
    from traceops.tasks.train import _rehearsal, rehearsal_draw, rehearsal_logs
    from traceops.train import train_adapter
    from traceops.train.budgets import BUDGETS

    (home / "params.yaml").write_text(yaml.safe_dump({"train": {"rehearsal_share": 0.25}}))  # default: off
    settings = config.load(home)
    trajectories = logs(40)
    append_trajectories(settings.paths, trajectories)
    capability = "tool_call_format"
    failed = [t.model_copy(update={"outcome": Outcome(success=False)}) for t in trajectories[:6]]
    synthesize([capability], failed, settings.paths.environments,
               {"train_size": 6, "val_size": 2, "test_size": 2})
    manifest = json.loads((settings.paths.environments / capability / "manifest.json").read_text())
    assert manifest["grounding"]["domain"] == "shop"
    logged = rehearsal_logs(settings)
    draw = rehearsal_draw(settings, capability, logged, seed=0)
    assert draw is not None and len(draw["ids"]) == 2  # 0.25 of 6 + 2 rows
    held = {t.id for t in trajectories if is_heldout(t.task_id, 0, 0.2)}
    other = {t.id for t in trajectories if t.domain != "shop"}
    assert not set(draw["ids"]) & (held | other)
    budget = replace(BUDGETS["tiny"], sft_steps=1, grpo_steps=0, eval_tasks=1, eval_max_new_tokens=4,
                     sft_max_length=64)
    base = adapter_key(settings, capability, budget.as_dict(), "tiny", 0)
    assert adapter_key(settings, capability, budget.as_dict(), "tiny", 0, draw["key"]) != base
    assert adapter_key(settings, capability, budget.as_dict(), "tiny", 0, None) == base
    rehearsal = _rehearsal(settings.paths, draw, tiny_model_dir, budget)
    assert rehearsal.trajectory_ids == draw["ids"] and rehearsal.max_tokens > budget.sft_max_length
    result = train_adapter(capability, settings.paths.environments / capability, tiny_model_dir,
                           home / "ckpt", budget, seed=0, rehearsal=rehearsal)
    assert result.config["rehearsal"]["trajectory_ids"] == draw["ids"]
    assert result.config["rehearsal"]["sft_max_length"] == rehearsal.max_tokens  # lengthened, for SFT only
    assert result.config["budget"]["sft_max_length"] == 64
    assert len(result.sft_losses) == 1 and result.sft_losses[0] > 0
    (home / "params.yaml").write_text(yaml.safe_dump({"train": {"rehearsal_share": 0}}))
    off = config.load(home)
    assert rehearsal_logs(off) == [] and rehearsal_draw(off, capability, logged, seed=0) is None
