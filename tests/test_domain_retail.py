"""The retail domain: seeded database, tools, scripted user, generated tasks and the verifier."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from traceops.domains import Domain, domain_names, get_domain
from traceops.domains.retail import KINDS, RetailEnv, generate_tasks, get_task
from traceops.domains.retail.database import generate_database, pristine_database
from traceops.domains.retail.task import WRITE_TOOLS
from traceops.envs.base import play
from traceops.errors import ConfigError
from traceops.hashing import content_hash


@pytest.fixture(scope="module")
def domain() -> Domain:
    return get_domain("retail")


def test_database_is_deterministic_from_the_seed() -> None:
    first, again, other = generate_database(0), generate_database(0), generate_database(1)
    assert content_hash(first) == content_hash(again)
    assert content_hash(first) != content_hash(other)
    assert set(first) == {"users", "products", "orders", "tickets"}
    statuses = {o["status"] for o in first["orders"].values()}
    assert statuses == {"pending", "processed", "delivered", "cancelled"}
    user = first["users"]["user_0042"]
    assert user["email"].endswith("@example.com")
    assert set(user["address"]) == {"address1", "city", "state", "zip"}
    assert all(oid.startswith("#W") and len(oid) == 9 for oid in first["orders"])


def test_tasks_are_generated_many_kinds_unique_and_prefix_stable(domain: Domain) -> None:
    tasks = domain.tasks()
    assert len(tasks) >= 60
    assert set(Counter(t.kind for t in tasks)) == set(KINDS)
    assert len({t.instruction for t in tasks}) == len(tasks)
    assert [t.id for t in generate_tasks(0, 30)] == [t.id for t in tasks[:30]]
    assert generate_tasks(0, 30) == tasks[:30]
    assert [t.instruction for t in generate_tasks(1, 30)] != [t.instruction for t in tasks[:30]]
    # Every task with calls has a write or a required output, so losing a step is always visible.
    for task in generate_tasks(0, None):
        if task.actions:
            assert task.outputs or any(c.name in WRITE_TOOLS for c in task.actions), task.id


def test_oracle_scores_one_on_every_task(domain: Domain) -> None:
    env = domain.make_env()
    for task in generate_tasks(0, None):
        env.reset(**task.spec())
        assert play(env, task.spec(), env.oracle()) == 1.0, (task.id, env.reward_breakdown())
    # Episodes wrote copies: the shared pristine database is untouched.
    assert pristine_database(0) == generate_database(0)


def test_forbidden_writes_and_silence_fail(domain: Domain) -> None:
    env = domain.make_env()
    policy_tasks = [t for t in domain.tasks(200) if t.forbidden is not None]
    assert len(policy_tasks) >= 20
    for task in policy_tasks:
        env.reset(**task.spec())
        for call in task.actions:
            env.call_tool(call.name, dict(call.arguments))
        env.call_tool(task.forbidden.name, dict(task.forbidden.arguments))
        env.respond(task.turns[-1].content)
        assert env.reward_breakdown() == {"db": 0.0, "communicate": 1.0}, task.id
    # Doing every gold step but never saying the required fact fails the communicate check.
    lookup = next(t for t in domain.tasks() if t.kind == "order_total")
    env.reset(**lookup.spec())
    for call in lookup.actions:
        env.call_tool(call.name, dict(call.arguments))
    env.respond("Done.")
    assert env.reward_breakdown() == {"db": 1.0, "communicate": 0.0}
    assert env.get_reward() == 0.0


def test_out_of_scope_tasks_fail_on_any_tool_call(domain: Domain) -> None:
    env = domain.make_env()
    task = next(t for t in domain.tasks() if t.kind == "out_of_scope")
    env.reset(**task.spec())
    env.call_tool("list_products", {})
    env.respond("I can only help with our store.")
    assert env.reward_breakdown() == {"db": 1.0, "communicate": 1.0, "no_tool_use": 0.0}


def test_tool_errors_are_observations_and_unknown_calls_are_noops(domain: Domain) -> None:
    env = domain.make_env()
    task = next(t for t in domain.tasks() if t.kind == "recover_out_of_stock")
    env.reset(**task.spec())
    assert env.call_tool("get_order_details", {"order_id": "W1234567"}).startswith("Error: invalid order id")
    missing = env.call_tool("get_order_details", {"order_id": "#W0000001"})
    assert missing == "Error: order #W0000001 not found"
    assert env.call_tool("delete_everything", {}).startswith("Error: unknown tool")
    assert env.call_tool("cancel_pending_order", {"order_id": 7}).startswith("Error:")
    assert env.call_tool("update_user_address", {"user_id": None, "address1": 1, "city": "x", "state": "y",
                                                 "zip": "z"}).startswith("Error:")
    out_of_stock = task.actions[2]
    assert "out of stock" in env.call_tool(out_of_stock.name, dict(out_of_stock.arguments))
    assert env.touched == set()  # nothing above wrote anything
    product_id = task.actions[3].arguments["product_id"]
    details = json.loads(env.call_tool("get_product_details", {"product_id": product_id}))
    assert "variants" in details


def test_scripted_user_answers_questions_from_its_facts(domain: Domain) -> None:
    env = domain.make_env()
    task = next(t for t in domain.tasks() if t.kind == "order_status")
    assert env.reset(**task.spec()) == task.instruction
    assert env.respond("Could you tell me your email address?") == task.facts["email"]
    assert env.respond("What is your favourite colour?") is None
    assert env.respond("Your order is pending.") is None


def test_tools_have_schemas_and_the_policy_is_the_system_prompt(domain: Domain) -> None:
    env = domain.make_env()
    names = env.tool_names()
    assert {"find_user_by_email", "get_order_details", "cancel_pending_order", "transfer_to_human_agents",
            "exchange_delivered_order_items", "update_user_address"} <= set(names)
    assert not {"reward_breakdown", "respond", "oracle", "reset", "get_reward"} & set(names)
    for spec in env.tool_specs():
        function = spec["function"]
        assert function["description"] and function["parameters"]["type"] == "object"
    assert env.system_prompt == domain.policy and "pending" in domain.policy


def test_unknown_domain_and_task_fail_clearly(domain: Domain) -> None:
    assert domain_names() == ["retail"]
    with pytest.raises(ConfigError, match="unknown domain 'shop'; valid domains: retail"):
        get_domain("shop")
    with pytest.raises(ConfigError, match="unknown retail task id 'retail-99999'; valid ids are retail-0000"):
        domain.task("retail-99999")
    with pytest.raises(ConfigError, match="unknown retail task id"):
        RetailEnv().reset(task_id="nope")
    with pytest.raises(ConfigError, match="supports 0 to"):
        domain.tasks(10**6)
    assert get_task(0, "retail-0003") == domain.task("retail-0003")
