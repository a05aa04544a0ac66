"""Logged first exchanges replayed with fresh values (traceops.envs.exchanges).

The retail night's adapters, trained on tasks built tool by tool, scored 0 of 32 held-out real requests
(base 6): production asks "my email is X, cancel order #W...", and the logged right first reply is to find
the customer, not to cancel. These tests pin that native tasks now replay the logs' request kinds with
their logged first reply, fresh values in the logged formats, the request's own tools and system prompt.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from traceops.envs.exchange_mining import mine_exchange
from traceops.envs.exchanges import fill_exchange, never_first_tools, replay_share, replay_task
from traceops.envs.families import FAMILIES
from traceops.envs.grounding import ValueFactory, build_grounding
from traceops.envs.native import check_task
from traceops.formats.detect import iter_items
from traceops.heldout import request_values, split_trajectories
from traceops.schema import Trajectory

SAMPLE = Path(__file__).parents[1] / "data" / "raw" / "sample" / "planted-retail.jsonl"


@pytest.fixture(scope="module")
def split() -> tuple[list[Trajectory], list[Trajectory]]:
    return split_trajectories(list(iter_items([SAMPLE])), 0, 0.2)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def grounding(split):
    train, heldout = split
    return build_grounding(train, exclude=sorted(request_values(heldout)), phrasing_from=train)


def test_a_request_becomes_a_template_with_every_value_slotted():
    request = "My email is ava.kim12@example.com. Cancel order #W1234567, I ordered it by mistake."
    call = {"name": "find_user_by_email", "arguments": {"email": "ava.kim12@example.com"}}
    template = mine_exchange(request, [call], ["cancel_pending_order", "find_user_by_email"])
    assert template["text"] == "My email is |0|. Cancel order |1|, I ordered it by mistake."
    assert template["slots"] == [{"arg": [0, "email"], "value": "ava.kim12@example.com"},
                                 {"shape": "#W1234567"}]
    assert template["calls"] == [{"name": "find_user_by_email", "arguments": {"email": {"slot": 0}}}]
    assert template["tools"] == ["cancel_pending_order", "find_user_by_email"]


def test_a_reply_the_text_cannot_reproduce_is_not_mined():
    # the planted agent's wrong email: a value the request never states
    assert mine_exchange("My email is ava.kim12@example.com.",
                         [{"name": "find_user_by_email", "arguments": {"email": "customer5@example.org"}}],
                         ["find_user_by_email"]) is None
    # a value that is not id-like and not in the text is kept as logged
    kept = mine_exchange("Cancel it, I ordered it by mistake, order #W1234567.",
                         [{"name": "cancel_pending_order",
                           "arguments": {"order_id": "#W1234567", "reason": "ordered by mistake"}}], ["x"])
    assert kept["calls"][0]["arguments"]["reason"] == {"value": "ordered by mistake"}


def test_a_broken_call_is_never_mined_as_a_reply_without_calls(split):
    train, _ = split
    declines = [t for t in train if not t.outcome.failed and t.messages[2].role == "assistant"
                and not t.messages[2].tool_calls and "only help" in (t.messages[2].content or "")]
    assert declines
    broken_text = '<tool_call>{"name": "find_user_by_email", "arguments": {email: "a@b.co"}</tool_call>'
    broken = [t.model_copy(update={"messages": [*t.messages[:2], t.messages[2].model_copy(
        update={"content": broken_text}), *t.messages[3:]]}) for t in declines]
    assert build_grounding(declines).exchanges
    assert build_grounding(broken).exchanges == ()


def test_retail_exchanges_follow_the_logged_first_replies(grounding):
    assert grounding.interface == "native"
    kinds = {c["name"] for t in grounding.exchanges for c in t["calls"]}
    assert kinds == {"find_user_by_email", "find_user_by_name_zip", "list_products"}
    assert any(not t["calls"] and "only help" in t.get("reply", "") for t in grounding.exchanges)
    # the logs show a first-reply pattern (find the customer first): replays make most tasks
    assert replay_share(grounding) == pytest.approx(0.9)
    assert {"cancel_pending_order", "get_order_details"} <= never_first_tools(grounding)
    assert not {"find_user_by_email", "list_products"} & never_first_tools(grounding)


def test_a_filled_exchange_has_fresh_values_in_the_logged_formats(grounding):
    values = ValueFactory(grounding, random.Random(0))
    template = next(t for t in grounding.exchanges if "|1|" in t["text"] and t["calls"])
    text, calls = fill_exchange(template, grounding, values)
    email = calls[0]["arguments"]["email"]
    assert email in text and email not in grounding.observed_values
    order = re.search(r"#W\d{6,7}", text).group(0)
    assert order not in grounding.observed_values


def test_replayed_tasks_offer_the_logged_tools_and_prompt(grounding):
    rng = random.Random(1)
    values = ValueFactory(grounding, rng)
    tasks = [replay_task(rng, values, grounding) for _ in range(60)]
    logged_order = [t["name"] for t in grounding.tools if t.get("native")]
    for task in tasks:
        check_task(task)
        assert sorted(s["function"]["name"] for s in task["tools"]) == sorted(logged_order)
        assert task["system_prompt"].startswith("# Retail customer-support agent policy")
    assert sum(not t["gold"]["calls"] for t in tasks) >= 3  # declines and questions back, as logged
    assert all(t["gold"]["calls"] for t in [replay_task(rng, values, grounding, calls=True)
                                             for _ in range(20)])


def test_retail_tool_selection_speaks_the_agent_interface(grounding, split):
    _, heldout = split
    tasks = FAMILIES["tool_selection"].generate(grounding, 0, 40, exclude=sorted(request_values(heldout)))
    firsts = [t["gold"]["calls"][0]["name"] if t["gold"]["calls"] else None for t in tasks]
    assert firsts.count("find_user_by_email") > len(tasks) / 3  # authenticate first, as the logs do
    assert not any(t["instruction"].startswith("APIs you can call") for t in tasks)
    assert all(s["function"]["name"] != "call_api" for t in tasks for s in t["tools"])


def test_replays_follow_the_no_call_share_not_the_mix_of_successes(grounding, split):
    from dataclasses import replace

    from traceops.envs.native import no_call_share

    _, heldout = split
    tasks = FAMILIES["tool_selection"].generate(grounding, 0, 90, exclude=sorted(request_values(heldout)))
    declines = sum(not t["gold"]["calls"] for t in tasks) / len(tasks)
    assert 0.1 < no_call_share(grounding) < 0.3 and 0.05 < declines < 0.35
    # a base agent's successes are mostly declines (BFCL): its replays must not turn most tasks into declines
    declined = [{**t, "count": 20} if not t["calls"] else t for t in grounding.exchanges]
    skewed = replace(grounding, exchanges=tuple(declined))
    tasks = FAMILIES["tool_selection"].generate(skewed, 0, 90, exclude=sorted(request_values(heldout)))
    assert sum(not t["gold"]["calls"] for t in tasks) / len(tasks) < 0.3
