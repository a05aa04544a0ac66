"""Environment synthesis: registry, grounding, families, verifiers, mutations and self-tests."""

from __future__ import annotations

import inspect
import json
import random

import pytest

from traceops.envs import FAMILIES, get_family
from traceops.envs.base import AssistantTurn, Call, play, tool_method_names
from traceops.envs.family import TaskError
from traceops.envs.grounding import (
    GroundingError,
    ValueFactory,
    assert_disjoint,
    build_grounding,
    select_seeds,
)
from traceops.envs.mutations import OPERATORS, effective_calls
from traceops.envs.selftest import self_test
from traceops.envs.verify import args_match, normalize_value, single_call_reward, state_hash
from traceops.errors import TraceopsError
from traceops.schema import Label, Message, Outcome, Source, ToolCall, ToolSpec, Trajectory

CAPABILITIES = (
    "tool_call_format",
    "tool_selection",
    "argument_grounding",
    "multi_step_transaction",
    "state_tracking",
    "error_recovery",
    "policy_adherence",
    "irrelevance_refusal",
)

TOOLS = [
    ToolSpec(
        name="get_order_details",
        description="Get the status and details of an order",
        parameters={
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    ),
    ToolSpec(
        name="cancel_pending_order",
        description="Cancel a pending order",
        parameters={
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "reason": {"type": "string", "enum": ["no longer needed", "ordered by mistake"]},
            },
            "required": ["order_id", "reason"],
        },
    ),
    ToolSpec(
        name="modify_user_address",
        description="Modify the default address of a user",
        parameters={
            "type": "object",
            "properties": {
                "user_id": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string"},
            },
            "required": ["user_id", "city", "zip"],
        },
    ),
    ToolSpec(
        name="find_user_id_by_email",
        description="Find a user id by email",
        parameters={"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]},
    ),
]


def trajectory(
    index: int,
    capability: str,
    *,
    tools: bool = True,
    success: bool = False,
    text: str = "I want to cancel my order.",
) -> Trajectory:
    """A small retail-like failed run with tool calls, outputs and a label."""
    order, user = f"#W{1000000 + index:07d}", f"user_{index:04d}"
    messages = [
        Message(role="user", content=f"{text} It is {order}."),
        Message(
            role="assistant",
            tool_calls=[ToolCall(id="c1", name="get_order_details", arguments={"order_id": order})],
        ),
        Message(
            role="tool",
            tool_call_id="c1",
            content=json.dumps({"order_id": order, "user_id": user, "status": "pending", "total": 120.5}),
        ),
        Message(
            role="assistant",
            tool_calls=[
                ToolCall(
                    id="c2",
                    name="cancel_pending_order",
                    arguments={"order_id": order, "reason": "no longer needed"},
                )
            ],
        ),
        Message(
            role="assistant",
            tool_calls=[
                ToolCall(
                    id="c3", name="find_user_id_by_email", arguments={"email": f"jane.{index}@shop.test"}
                )
            ],
        ),
        Message(role="assistant", content="Done."),
    ]
    return Trajectory(
        task_id=f"t{index}",
        domain="retail",
        tools=TOOLS if tools else [],
        messages=messages,
        outcome=Outcome(success=success, reward=1.0 if success else 0.0),
        source=Source(format="openai", file="x.jsonl", record=index),
        labels=[Label(source="rule", capability=capability)],
    )


@pytest.fixture(scope="module")
def logs() -> list[Trajectory]:
    runs = [trajectory(i, CAPABILITIES[i % len(CAPABILITIES)]) for i in range(16)]
    return runs + [trajectory(100, "tool_selection", success=True)]


@pytest.fixture(scope="module")
def grounding(logs):
    return build_grounding(logs, interface="catalog")  # the call-API families' catalog interface


# ----- registry -------------------------------------------------------------------------------------------


def test_registry_covers_every_capability():
    assert set(FAMILIES) == set(CAPABILITIES)
    for capability in CAPABILITIES:
        assert get_family(capability).capability == capability
        assert get_family(capability).env_class.capability == capability


def test_unknown_capability_is_a_clear_error():
    with pytest.raises(TraceopsError, match="no environment family covers capability 'telepathy'"):
        get_family("telepathy")


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_tools_are_class_functions_with_schemas(capability):
    family = get_family(capability)
    names = tool_method_names(family.env_class)
    assert names, "an environment needs tools"
    for hidden in ("oracle", "respond", "tool_names", "tool_specs", "call_tool", "reset", "get_reward"):
        assert hidden not in names
    members = dict(inspect.getmembers(family.env_class, inspect.isfunction))
    specs = family.make_env().tool_specs()
    assert [s["function"]["name"] for s in specs] == names
    for spec in specs:
        assert inspect.isfunction(members[spec["function"]["name"]])
        assert spec["function"]["description"]


# ----- grounding ------------------------------------------------------------------------------------------


def test_grounding_reads_tools_entities_outputs(grounding):
    assert grounding.source == "logs"
    assert grounding.domain == "retail"
    names = [t["name"] for t in grounding.tools]
    assert "cancel_pending_order" in names
    cancel = grounding.tool("cancel_pending_order")
    reason = next(a for a in cancel["args"] if a["name"] == "reason")
    assert reason["enum"] == ["no longer needed", "ordered by mistake"]
    assert grounding.entities["order"]["prefix"] == "#W" and grounding.entities["order"]["digits"] == 7
    assert grounding.entities["email"]["domain"] == "shop.test"
    assert "status" in grounding.outputs["get_order_details"]
    assert "#W1000003" in grounding.observed_values
    # phrasing carrying ids is dropped; the id-free first sentence is kept
    assert grounding.phrasings == ("I want to cancel my order.",)


def test_grounding_inferred_and_default(logs):
    no_schemas = [trajectory(i, "tool_selection", tools=False) for i in range(3)]
    inferred = build_grounding(no_schemas)
    assert inferred.source == "inferred"
    cancel = inferred.tool("cancel_pending_order")
    assert [a["name"] for a in cancel["args"]] == ["order_id", "reason"]
    assert cancel["args"][0]["type"] == "string"
    default = build_grounding([])
    assert default.source == "default" and default.tools


def test_grounding_hash_is_stable_and_sensitive(logs):
    assert build_grounding(logs).hash == build_grounding(list(logs)).hash
    assert build_grounding(logs).hash != build_grounding(logs[:4]).hash


def test_fresh_values_are_disjoint_from_logs_and_exclude(grounding):
    exclude = {f"#W{n:07d}" for n in range(9000000, 9000100)}
    values = ValueFactory(grounding, random.Random(0), exclude)
    minted = [values.fresh_id("order") for _ in range(200)]
    assert len(set(minted)) == 200
    assert not set(minted) & (exclude | set(grounding.observed_values))
    assert all(m.startswith("#W") and len(m) == 9 for m in minted)
    email = values.fresh_email()
    assert email.endswith("@shop.test") and email not in grounding.observed_values


def test_assert_disjoint_catches_a_leak():
    task = {"task_id": "x", "gold": {"arguments": {"order_id": "#W1234567"}}}
    with pytest.raises(GroundingError, match="appears in evaluation data"):
        assert_disjoint([task], {"#W1234567"}, fields=["gold"])
    assert_disjoint([task], {"#W7654321"}, fields=["gold"])


def test_seed_selection_nearest_failures_first(logs):
    seeds = select_seeds(logs, "tool_selection", 5)
    assert seeds and all(not t.outcome.success for t in seeds)
    assert all(any(lab.capability == "tool_selection" for lab in t.labels) for t in seeds)
    odd = trajectory(200, "tool_selection", text="Completely unrelated words about gardening tomatoes.")
    ranked = select_seeds([*logs, odd], "tool_selection", 10)
    assert ranked[-1].id == odd.id  # the outlier is farthest from the failure cluster
    embeddings = {t.id: [1.0, 0.0] for t in logs} | {odd.id: [0.0, 1.0]}
    by_vector = select_seeds([*logs, odd], "tool_selection", 10, embeddings=embeddings, centroid=[0.0, 1.0])
    assert by_vector[0].id == odd.id


# ----- verifiers ------------------------------------------------------------------------------------------


def test_argument_normalization():
    assert args_match({"n": "3", "name": " Ann  Lee "}, {"n": 3, "name": "Ann Lee"})
    assert args_match({"x": 2.0, "flag": "true"}, {"x": 2, "flag": True})
    assert args_match({"reason": "No Longer Needed"}, {"reason": "no longer needed"}, enum_args=["reason"])
    assert not args_match({"reason": "No Longer Needed"}, {"reason": "no longer needed"})
    assert not args_match({"n": 3}, {"n": 3, "m": 1})
    assert normalize_value({"a": ["1", 2.5]}) == {"a": [1, 2.5]}


def test_single_call_reward_partial_credit():
    gold = {"a": 1, "b": "x"}
    assert single_call_reward([("f", {"a": 1, "b": "x"})], "f", gold) == 1.0
    assert single_call_reward([("f", {"a": 1, "b": "y"})], "f", gold) == 0.25
    assert single_call_reward([("f", {"a": 1, "b": "y"})], "f", gold, partial_credit=False) == 0.0
    assert single_call_reward([("g", gold)], "f", gold) == 0.0
    assert single_call_reward([("f", gold), ("f", gold)], "f", gold) == 0.0
    assert single_call_reward([], "f", gold) == 0.0


def test_state_hash_only_touched_tables():
    tables = {"orders": {"#W1": {"status": "pending"}}, "users": {"u1": {"city": "Reno"}}}
    changed = {"orders": {"#W1": {"status": "pending"}}, "users": {"u1": {"city": "Salem"}}}
    assert state_hash(tables, ["orders"]) == state_hash(changed, ["orders"])
    assert state_hash(tables, ["orders", "users"]) != state_hash(changed, ["orders", "users"])


# ----- families -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_family_oracle_mutations_and_determinism(capability, grounding):
    family = get_family(capability)
    tasks = family.generate(grounding, 7, 45)
    assert {t["level"] for t in tasks} == set(family.levels)
    assert len({t["task_id"] for t in tasks}) == len(tasks)
    json.dumps(tasks)  # plain JSON-able specs
    again = family.generate(grounding, 7, 45)
    assert again == tasks
    assert family.generate(grounding, 8, 5) != tasks[:5]
    report = self_test(family, tasks, regenerated=family.generate(grounding, 7, 10))
    assert report["oracle_rate"] == 1.0
    assert report["deterministic"] is True
    assert report["passed"], report["operators"]
    applied = [name for name, o in report["operators"].items() if o["applied"]]
    assert len(applied) >= 5
    observed = {v for v in grounding.observed_values if v.startswith(("#W", "user_")) or "@" in v}
    text = json.dumps(tasks)
    assert not any(value in text for value in observed), "a logged entity leaked into generated tasks"


def test_levels_grow_harder(grounding):
    selection = get_family("tool_selection").generate(grounding, 1, 3)
    assert [len(t["apis"]) for t in selection] == [2, 4, 8]
    steps = get_family("multi_step_transaction").generate(grounding, 1, 3)
    writes = [sum(c["name"] != "get_record" for c in t["gold"]) for t in steps]
    assert writes[0] < writes[1] < writes[2]
    fmt = get_family("tool_call_format").generate(grounding, 1, 3)
    assert any(isinstance(v, dict) for v in fmt[2]["gold"]["arguments"].values())


def test_grounded_names_reach_the_tasks(grounding):
    tasks = get_family("tool_selection").generate(grounding, 3, 20)
    used = {t["gold"]["name"] for t in tasks}
    assert used <= {t["name"] for t in grounding.tools}
    lookups = [t for t in get_family("argument_grounding").generate(grounding, 3, 9) if t["level"] == 3]
    assert lookups and all(t["lookups"][0]["name"] == "find_records" for t in lookups)
    for task in lookups:
        gold_id = next(v for k, v in task["gold"]["arguments"].items() if k.endswith("_id"))
        assert gold_id not in task["instruction"]  # must be looked up, not copied


def test_unknown_and_hallucinated_calls_are_noops(grounding):
    family = get_family("multi_step_transaction")
    task = family.generate(grounding, 0, 1)[0]
    env = family.make_env()
    env.reset(**task)
    assert env.call_tool("drop_database", {}).startswith("Error: unknown tool")
    assert env.call_tool("update_record", {"table": "nope", "key": "k", "field": "f", "value": 1}).startswith(
        "Error"
    )
    assert env.call_tool("update_record", {"table": "orders"}).startswith("Error: invalid arguments")
    assert play(env, task, env.oracle()) == 1.0
    assert play(env, task, [AssistantTurn(calls=(Call("drop_database", {}),)), *env.oracle()]) == 1.0


def test_refusal_needs_an_explicit_refusal(grounding):
    family = get_family("irrelevance_refusal")
    task = family.generate(grounding, 0, 1)[0]
    env = family.make_env()
    assert play(env, task, [AssistantTurn(content="...")]) == 0.0
    assert play(env, task, env.oracle()) == 1.0
    api = task["apis"][0]["name"]
    wrong = [AssistantTurn(calls=(Call("call_api", {"name": api, "arguments": {}}),)), *env.oracle()]
    assert play(env, task, wrong) == 0.0


def test_error_recovery_demonstration_contains_the_failure(grounding):
    family = get_family("error_recovery")
    env = family.make_env()
    for task in family.generate(grounding, 2, 3):
        env.reset(**task)
        results = [env.call_tool(c.name, dict(c.arguments)) for t in env.oracle() for c in t.calls]
        assert sum(r.startswith("Error") for r in results) == task["expected_errors"] >= 1
        assert env.get_reward() == 1.0


def test_reset_accepts_dataset_rows_and_rejects_foreign_tasks(grounding):
    family = get_family("tool_call_format")
    task = family.generate(grounding, 0, 1)[0]
    env = family.make_env()
    row = {
        "task_id": task["task_id"],
        "capability": task["capability"],
        "level": task["level"],
        "task_json": json.dumps(task),
        "prompt": [{"role": "user", "content": ""}],
    }
    assert env.reset(**row) == task["instruction"]
    other = get_family("tool_selection").generate(grounding, 0, 1)[0]
    with pytest.raises(TaskError, match="serves 'tool_call_format'"):
        env.reset(**other)
    with pytest.raises(TaskError, match="missing field"):
        env.reset(capability="tool_call_format")


def test_each_operator_is_exercised(grounding):
    family = get_family("multi_step_transaction")
    env = family.make_env()
    task = next(t for t in family.generate(grounding, 0, 6) if t["level"] == 3)
    env.reset(**task)
    turns = env.oracle()
    targets = effective_calls(env, task, turns)
    for name, operator in OPERATORS.items():
        env.reset(**task)
        mutated = operator(env, turns, random.Random(name), targets=targets)
        assert mutated is not None and mutated != turns, name
        assert play(env, task, mutated) < 1.0, name


def test_policy_oracle_says_each_decision_after_reading(grounding):
    family = get_family("policy_adherence")
    for task in family.generate(grounding, 4, 12):
        env = family.make_env()
        env.reset(**task)
        turns = env.oracle()
        decisions = task["decisions"]
        assert play(family.make_env(), task, turns) == 1.0
        said = " ".join(t.content or "" for t in turns)
        for d in decisions:  # every record's status and verdict is said in words
            assert f"{d['key']} is {d['status']}" in said
            assert ("allowed" if d["allowed"] else "declined") in said
        final = turns[-1].content or ""
        declined = [d["key"] for d in decisions if not d["allowed"]]
        assert not turns[-1].calls and f"Declined: {', '.join(declined)}." in final
        # An allowed write follows its verdict in the same turn; the verdict follows the read.
        for before, turn in zip(turns, turns[1:], strict=False):
            if turn.calls and turn.calls[0].name == "update_record":
                assert before.calls[0].name == "get_record" and "allowed" in (turn.content or "")
