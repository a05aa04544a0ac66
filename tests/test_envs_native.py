"""Environments in the agent's own interface (issue 28 items 1, 2), over unseen-domain call logs.

The fixture (tests/fixtures/unseen/) is 20 OpenAI call logs of a lab-services agent with six tools
(integer, number, enum, date-string, nested-object parameters): 12 single calls, 4 replies with several
calls, 4 replies that call nothing to unrelated requests, and an outcomes side file. ``prompted_logs``
are the same requests opened with the agent's system prompt (most of them; an older prompt or none on the
rest), as production requests are.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from traceops.envs.base import AssistantTurn, Call, play
from traceops.envs.families import FAMILIES
from traceops.envs.grounding import build_grounding
from traceops.envs.native import NativeTaskError, check_task, schema_errors, system_prompt_for
from traceops.envs.phrasing import mine_template, spoken_value, unit_of
from traceops.envs.selftest import self_test
from traceops.formats.detect import iter_items
from traceops.schema import Message, Trajectory

FIXTURE = Path(__file__).parent / "fixtures" / "unseen" / "calls.jsonl"
NATIVE_FAMILIES = ("tool_call_format", "tool_selection", "argument_grounding", "irrelevance_refusal")
AGENT_PROMPT = ("You are LabDesk, the assistant of Kestrel Labs' service desk. Use the lab's tools for "
                "anything they can do; politely decline anything else.")
OLD_PROMPT = "You are a helpful lab assistant."


@pytest.fixture(scope="module")
def logs() -> list[Trajectory]:
    items = list(iter_items([FIXTURE]))
    assert all(isinstance(t, Trajectory) for t in items) and len(items) == 20
    return items  # type: ignore[return-value]


@pytest.fixture(scope="module")
def grounding(logs):
    return build_grounding(logs)


@pytest.fixture(scope="module")
def tasks(grounding) -> dict[str, list[dict[str, Any]]]:
    return {name: FAMILIES[name].generate(grounding, 3, 48) for name in NATIVE_FAMILIES}


@pytest.fixture(scope="module")
def prompted_logs(logs) -> list[Trajectory]:
    """15 requests open with AGENT_PROMPT, 3 with OLD_PROMPT, 2 with no system message."""
    out = []
    for index, trajectory in enumerate(logs):
        text = AGENT_PROMPT if index % 4 else OLD_PROMPT if index % 8 == 0 else None
        system = [Message(role="system", content=text)] if text else []
        out.append(trajectory.model_copy(update={"messages": [*system, *trajectory.messages]}))
    return out


@pytest.fixture(scope="module")
def prompted_tasks(prompted_logs) -> dict[str, list[dict[str, Any]]]:
    grounding = build_grounding(prompted_logs)
    return {name: FAMILIES[name].generate(grounding, 3, 24) for name in NATIVE_FAMILIES}


def opening(task: dict[str, Any]) -> list[dict[str, str]]:
    """What a trained model is prompted with for a production request of this task: the logged system
    prompt (if any) and the request, as ``TrainedChatModel`` renders them (the default system prompt in
    front of a request without one)."""
    from traceops.model.adapted import training_conversation

    system = [{"role": "system", "content": task["system_prompt"]}] if "system_prompt" in task else []
    return training_conversation([*system, {"role": "user", "content": task["instruction"]}])


def logged_specs(logs: list[Trajectory]) -> dict[str, dict[str, Any]]:
    return {t.name: {"type": "function", "function": {"name": t.name, "description": t.description,
                                                      "parameters": t.parameters}}
            for t in logs[0].tools}


def test_grounding_speaks_natively_and_mines_the_logged_phrasings(grounding, logs):
    assert grounding.interface == "native" and grounding.domain == "lab"
    assert grounding.max_parallel == 3 and grounding.no_call_replies == 4
    heat = grounding.templates["calculate_heat"]
    text = "How much heat do I need to warm |mass| kg of water from |initial_temp|K to |final_temp|K?"
    assert {"args": ["final_temp", "initial_temp", "mass"], "text": text} in heat
    logged = {str(v) for t in logs for m in t.messages for c in (m.tool_calls or [])
              for v in c.arguments.values()}
    for templates in grounding.templates.values():
        for template in templates:
            assert not re.search(r"\d", template["text"])  # no logged value survives in a template
            assert not any(v in template["text"] for v in logged if len(v) > 3)
    # the bundled retail domain speaks its tools natively too; the catalog interface is there when asked for
    retail = [t.model_copy(update={"domain": "retail"}) for t in logs]
    assert build_grounding(retail).interface == "native"
    assert build_grounding(retail, interface="catalog").interface == "catalog"


def test_mining_rejects_requests_that_would_copy_values():
    assert mine_template("Warm 2 kg from 300K to 340K", {"mass": 2, "a": 300, "b": 340}) is not None
    assert mine_template("Warm 2 kg from 300K to 340K in room 12", {"mass": 2, "a": 300, "b": 340}) is None
    assert mine_template("Case 7 and case 7", {"case_id": 7}) is None  # ambiguous
    assert mine_template("Look it up", {"case_id": 7}) is None  # value not in the text
    assert unit_of("Initial temperature in Kelvin") == "Kelvin" and unit_of("The city of departure") is None


def test_environment_tools_are_the_logged_schemas(tasks, logs):
    specs = logged_specs(logs)
    for name, family_tasks in tasks.items():
        env = FAMILIES[name].make_env()
        for task in family_tasks:
            env.reset(**task)
            offered = env.tool_specs()
            assert offered == [specs[s["function"]["name"]] for s in offered], name
            assert env.tool_names() == [s["function"]["name"] for s in offered]
            assert env.tools_vary() and env.system_prompt == ""
            assert "call_api" not in env.tool_names() and "refuse" not in env.tool_names()


def test_gold_calls_are_schema_valid_and_typed(tasks, logs):
    specs = logged_specs(logs)
    seen_types = set()
    for family_tasks in tasks.values():
        for task in family_tasks:
            check_task(task)
            for call in task["gold"]["calls"]:
                params = specs[call["name"]]["function"]["parameters"]
                assert schema_errors(call["arguments"], params) == []
                for key, value in call["arguments"].items():
                    declared = params["properties"][key]["type"]
                    seen_types.add(declared)
                    assert declared != "integer" or (isinstance(value, int) and not isinstance(value, bool))
                    assert declared != "number" or isinstance(value, (int, float))
                    if "enum" in params["properties"][key]:
                        assert value in params["properties"][key]["enum"]
                    if key == "date":
                        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", value)
                    if key == "sample_id":
                        assert re.fullmatch(r"SMP-\d{5}", value)  # the logged format, a fresh value
    assert {"integer", "number", "string"} <= seen_types
    bad = json.loads(json.dumps(tasks["tool_selection"][0]))
    call = bad["gold"]["calls"][0]
    key = sorted(call["arguments"])[0]
    call["arguments"][key] = {"nested": "object"}
    with pytest.raises(NativeTaskError, match="does not validate"):
        check_task(bad)
    with pytest.raises(NativeTaskError):
        self_test(FAMILIES["tool_selection"], [bad])


def test_requests_read_like_users(tasks, grounding):
    params = {n for t in grounding.tools for a in t["args"] if "_" in a["name"] for n in [a["name"]]}
    logged_ids = {v for v in grounding.observed_values if v.startswith("SMP-")}
    for family_tasks in tasks.values():
        for task in family_tasks:
            text = task["instruction"]
            assert not re.search(r"\bUse \w+ ", text) and "call_api" not in text
            assert not any(word in text for word in ("{", "\"type\"", "properties", "required", "APIs"))
            assert not any(p in text for p in params), text  # no parameter identifiers
            assert not any(i in text for i in logged_ids)
            for call in task["gold"]["calls"]:
                for value in call["arguments"].values():
                    if not isinstance(value, (bool, dict, list)):
                        assert spoken_value(value) in text, (value, text)


def test_task_kinds_single_selection_parallel_and_no_call(tasks, grounding):
    from dataclasses import replace

    composed = replace(grounding, exchanges=())  # the kinds composed beside the replayed logged exchanges
    every = [t for family_tasks in tasks.values() for t in family_tasks]
    every += [t for name in NATIVE_FAMILIES for t in FAMILIES[name].generate(composed, 3, 60)]
    single = [t for t in every if len(t["gold"]["calls"]) == 1]
    assert any(len(t["tools"]) == 1 for t in single)
    assert any(len(t["tools"]) >= 4 for t in single)  # selection among distractors from the logs
    parallel = [t for t in every if len(t["gold"]["calls"]) > 1]
    assert parallel and any(len({c["name"] for c in t["gold"]["calls"]}) > 1 for t in parallel)
    assert all(t["gold"]["calls"] == [] for t in tasks["irrelevance_refusal"])


@pytest.mark.parametrize("capability", NATIVE_FAMILIES)
def test_oracle_scores_one_and_mutations_below(capability, tasks, grounding):
    family = FAMILIES[capability]
    report = self_test(family, tasks[capability], regenerated=family.generate(grounding, 3, 24))
    assert report["passed"] and report["oracle_rate"] == 1.0, report
    if capability != "irrelevance_refusal":
        applied = {k for k, v in report["operators"].items() if v["applied"]}
        assert {"dropped_argument", "wrong_value", "extra_call", "truncated_json"} <= applied


def test_verifier_is_type_aware_and_order_free(tasks):
    env = FAMILIES["argument_grounding"].make_env()
    parallel = next(t for t in tasks["argument_grounding"] if len(t["gold"]["calls"]) > 1)
    calls = [Call(c["name"], c["arguments"]) for c in parallel["gold"]["calls"]]
    assert play(env, parallel, [AssistantTurn(calls=tuple(reversed(calls)))]) == 1.0
    assert 0.0 < play(env, parallel, [AssistantTurn(calls=tuple(calls[:-1]))]) < 1.0
    def has_int(call: dict[str, Any]) -> bool:
        return any(isinstance(v, int) and not isinstance(v, bool) for v in call["arguments"].values())

    single = next(t for family_tasks in tasks.values() for t in family_tasks
                  if len(t["gold"]["calls"]) == 1 and has_int(t["gold"]["calls"][0]))
    family = FAMILIES[single["capability"]].make_env()
    gold = single["gold"]["calls"][0]
    as_text = {k: str(v) if isinstance(v, int) and not isinstance(v, bool) else v
               for k, v in gold["arguments"].items()}
    assert play(family, single, [AssistantTurn(calls=(Call(gold["name"], gold["arguments"]),))]) == 1.0
    assert play(family, single, [AssistantTurn(calls=(Call(gold["name"], as_text),))]) == 0.0
    refusal = FAMILIES["irrelevance_refusal"].make_env()
    task = tasks["irrelevance_refusal"][0]
    assert play(refusal, task, refusal.oracle() if refusal.reset(**task) else []) == 1.0
    name = task["tools"][0]["function"]["name"]
    assert play(refusal, task, [AssistantTurn(calls=(Call(name, {}),))]) == 0.0
    # a call whose text did not parse is a broken call, not a decline (the grader's rule too)
    cut_off = f'<tool_call>{{"name": "{name}", "arguments": {{"'
    assert play(refusal, task, [AssistantTurn(content=cut_off)]) == 0.0
    assert play(refusal, task, [AssistantTurn(content="Sorry, I can't do that.")]) == 1.0
    assert play(family, single, [AssistantTurn(calls=(Call(gold["name"], gold["arguments"]),)),
                                 AssistantTurn(content=cut_off)]) < 1.0


class _GoldAgent:
    """A user's agent that answers every request with its gold calls, then "Done.": it records the tools
    each conversation was offered."""

    def __init__(self, tasks: list[dict[str, Any]]) -> None:
        from traceops.model.base import ModelInfo

        self.info = ModelInfo(model_id="gold-agent", weights_hash="none")
        self.by_request = {t["instruction"]: t for t in tasks}
        self.seen: list[tuple[str, list[dict[str, Any]]]] = []
        self.most_menus = 0  # the most distinct tool lists one generate call was given

    def generate(self, conversations, tools=None, config=None):  # type: ignore[no-untyped-def]
        from traceops.model.base import tools_per_conversation
        from traceops.model.toolcalls import assistant_text

        out = []
        offers = tools_per_conversation(tools, len(conversations))
        self.most_menus = max(self.most_menus, len({json.dumps(o, sort_keys=True) for o in offers}))
        for conversation, offered in zip(conversations, offers, strict=True):
            task = self.by_request[next(m["content"] for m in conversation if m["role"] == "user")]
            self.seen.append((task["task_id"], offered))
            if conversation[-1]["role"] == "tool" or not task["gold"]["calls"]:
                out.append("Done.")
            else:
                out.append(assistant_text(None, [(c["name"], c["arguments"]) for c in task["gold"]["calls"]]))
        return out


def test_agent_loop_offers_each_task_its_own_tools(tasks):
    from traceops.agent import run_episodes

    mixed = tasks["tool_selection"][:6] + tasks["irrelevance_refusal"][:4]
    family = FAMILIES["tool_selection"]
    agent = _GoldAgent(mixed)
    trajectories = run_episodes(agent, family.make_env, tasks["tool_selection"][:6], max_turns=3,
                                batch_size=4)
    assert [t.outcome.reward for t in trajectories] == [1.0] * 6
    by_id = {t["task_id"]: t for t in mixed}
    assert agent.seen and all(tools == by_id[task_id]["tools"] for task_id, tools in agent.seen)
    assert agent.most_menus > 1  # episodes offering different tools share a call
    assert [[s.name for s in t.tools] for t in trajectories] == [
        [s["function"]["name"] for s in task["tools"]] for task in tasks["tool_selection"][:6]]


def _write_folder(folder: Path, capability: str, tasks: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (folder / "manifest.json").write_text(json.dumps({"capability": capability}))
    return folder


@pytest.mark.parametrize("which", ["tasks", "prompted_tasks"])
def test_training_and_served_prompts_render_the_same_tools(which, request, tmp_path, tiny_model_dir):
    """SFT demo, GRPO row (train and export) and served prompt: the same text, tools and system message."""
    from traceops.envs.export import to_dataset
    from traceops.model.chat_template import load_tokenizer
    from traceops.model.toolcalls import render_prompt
    from traceops.train.data import grpo_rows, is_multi_turn, load_environment_set, sft_rows

    tasks = request.getfixturevalue(which)
    calling = [t for t in tasks["tool_selection"] if t["gold"]["calls"]]
    folder = _write_folder(tmp_path / "sel", "tool_selection", calling[:6])
    env_set = load_environment_set(folder)
    assert not is_multi_turn(env_set)  # per-task tools: single-turn GRPO on the replayed reply
    tokenizer = load_tokenizer(str(tiny_model_dir))
    rows = sft_rows(env_set)
    prompts = grpo_rows(env_set, tokenizer, multi_turn=False)
    exported = to_dataset(env_set.tasks("train"), FAMILIES["tool_selection"], tokenizer)
    assert ("system_prompt" in env_set.tasks("train")[0]) == (which == "prompted_tasks")
    for task, row, prompt, export in zip(env_set.tasks("train"), rows, prompts, exported, strict=True):
        first = opening(task)
        assert json.loads(row["tools"]) == task["tools"]
        assert row["messages"][: len(first)] == first
        assert row["messages"][len(first)]["content"].startswith("<tool_call>")
        served = render_prompt(tokenizer, first, task["tools"])
        trained = tokenizer.apply_chat_template(row["messages"][: len(first)], tools=json.loads(row["tools"]),
                                                tokenize=False, add_generation_prompt=True)
        assert served == trained == prompt["prompt"] == export["prompt"]
        assert json.loads(export["task_json"]) == task
        # the system text is the agent's logged one where the logs have one (the tools follow it)
        system_turn = served.split("<|im_end|>")[0]
        if which == "prompted_tasks":
            assert task["system_prompt"] == AGENT_PROMPT
            assert system_turn.startswith(f"<|im_start|>system\n{AGENT_PROMPT}\n")
        else:
            assert AGENT_PROMPT not in served and OLD_PROMPT not in served
        for spec in task["tools"]:
            assert spec["function"]["name"] in system_turn
            assert json.dumps(spec["function"]["parameters"]["properties"])[:40] in system_turn


def test_tiny_sft_step_consumes_native_demos(tmp_path, tasks, tiny_model_dir):
    from dataclasses import replace

    from transformers import AutoModelForCausalLM

    from traceops.model.chat_template import load_tokenizer
    from traceops.train.budgets import BUDGETS
    from traceops.train.config import AdapterSettings
    from traceops.train.data import load_environment_set, sft_rows
    from traceops.train.sft import build_sft_trainer, loss_curve

    chosen = tasks["tool_call_format"][:2] + tasks["irrelevance_refusal"][:2]
    env_set = load_environment_set(_write_folder(tmp_path / "fmt", "tool_call_format", chosen[:2]))
    rows = sft_rows(env_set)
    refusal = load_environment_set(_write_folder(tmp_path / "irr", "irrelevance_refusal", chosen[2:]))
    rows += sft_rows(refusal)
    # the right reply calls nothing
    assert [m["role"] for m in rows[-1]["messages"]] == ["system", "user", "assistant"]
    # a request and its one reply, as the logs are: no tool result, no closing "Done." to learn
    assert [m["role"] for m in rows[0]["messages"]] == ["system", "user", "assistant"]
    assert "<tool_call>" in rows[0]["messages"][-1]["content"]
    assert all("Done." not in m["content"] for row in rows for m in row["messages"])
    tokenizer = load_tokenizer(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    budget = replace(BUDGETS["tiny"], sft_steps=1, sft_batch_size=2, save_steps=100)
    trainer = build_sft_trainer(model, tokenizer, rows, budget, tmp_path / "ckpt", 0, AdapterSettings())
    trainer.train()
    losses = loss_curve(trainer.state.log_history)
    assert len(losses) == 1 and losses[0] > 0


def test_bad_schemas_are_reported_and_not_offered_tools_without_parameters_work(logs, tmp_path):
    from traceops.envs.synthesize import SynthesisParams, synthesize
    from traceops.schema import ToolSpec

    extra = [ToolSpec(name="broken_tool", description="Has a BFCL-style type.",
                      parameters={"type": "object", "properties": {"x": {"type": "dict"}}}),
             ToolSpec(name="ping_lab", description="Checks that the lab service is up.",
                      parameters={"type": "object", "properties": {}})]
    changed = [t.model_copy(update={"tools": [*t.tools, *extra]}) for t in logs]
    grounding = build_grounding(changed)
    broken = grounding.tool("broken_tool")
    problem = broken["schema_problem"]
    assert "invalid JSON schema" in problem and "calls.jsonl record" in problem
    every = [t for name in NATIVE_FAMILIES for t in FAMILIES[name].generate(grounding, 5, 60)]
    assert not any(s["function"]["name"] == "broken_tool" for t in every for s in t["tools"])
    ping = [t for t in every if any(c["name"] == "ping_lab" for c in t["gold"]["calls"])]
    assert ping and all(c["arguments"] == {} for t in ping for c in t["gold"]["calls"]
                        if c["name"] == "ping_lab")
    synthesize(["tool_selection"], changed, tmp_path, SynthesisParams(train_size=8, val_size=2, test_size=2))
    manifest = json.loads((tmp_path / "tool_selection" / "manifest.json").read_text())
    assert any("'broken_tool' is not offered" in note for note in manifest["notes"])
    assert "ping_lab" in manifest["tools"] and "call_api" not in manifest["tools"]
    assert manifest["grounding"]["interface"] == "native"


def test_no_call_requests_avoid_what_the_offered_tools_serve(logs):
    from traceops.schema import ToolSpec

    weather = ToolSpec(name="get_weather", description="The weather forecast for a city on a given day.",
                       parameters={"type": "object", "properties": {"city": {"type": "string"}},
                                   "required": ["city"]})
    grounding = build_grounding([t.model_copy(update={"tools": [*t.tools, weather]}) for t in logs])
    tasks = FAMILIES["irrelevance_refusal"].generate(grounding, 0, 90, levels=[1])
    offered = [t for t in tasks if any(s["function"]["name"] == "get_weather" for s in t["tools"])]
    assert offered and not any("weather" in t["instruction"].lower() for t in offered)
    assert any("weather" in t["instruction"].lower() for t in tasks)  # still asked where no tool serves it


@pytest.mark.slow
def test_tiny_adapter_trains_on_native_environments(tmp_path, tasks, tiny_model_dir):
    """SFT on the native demos, then single-turn GRPO on the replayed reward, then val rollouts through
    the agent loop with each task's own tools: the whole adapter path on a tiny model."""
    from dataclasses import replace

    from traceops.train import train_adapter
    from traceops.train.budgets import BUDGETS

    folder = _write_folder(tmp_path / "envs", "tool_selection", tasks["tool_selection"][:8])
    (folder / "val.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks["tool_selection"][8:10]))
    budget = replace(BUDGETS["tiny"], sft_steps=2, save_steps=100, grpo_steps=1, eval_tasks=2, max_turns=2,
                     eval_max_new_tokens=12, max_completion_length=12, native_sft_lr=2e-4)
    result = train_adapter("tool_selection", folder, tiny_model_dir, tmp_path / "out", budget=budget, seed=0)
    assert not result.config["multi_turn"] and len(result.sft_losses) == 2 and len(result.grpo_rewards) == 1
    # tasks that bring their own tools train at the budget's native SFT learning rate
    assert result.config["budget"]["sft_lr"] == 2e-4
    logged = json.loads((tmp_path / "out" / "train_logs.json").read_text())["sft"]
    assert [row["learning_rate"] for row in logged if "learning_rate" in row] == [2e-4, 2e-4]
    assert result.val_before["n"] == 2 and 0.0 <= result.val_after["success"] <= 1.0


def test_grounding_mines_the_most_common_system_prompt_per_tool_set(logs, prompted_logs, grounding):
    from dataclasses import replace

    names = sorted(t.name for t in logs[0].tools)
    mined = build_grounding(prompted_logs)
    assert mined.system_prompts == ({"tools": names, "content": AGENT_PROMPT, "requests": 20},)
    assert mined.to_dict()["system_prompts"] == [dict(mined.system_prompts[0])]
    # logs without system messages keep today's grounding (and hash); the catalog domain ignores them
    assert grounding.system_prompts == () and "system_prompts" not in grounding.to_dict()
    retail = [t.model_copy(update={"domain": "retail"}) for t in prompted_logs]
    assert build_grounding(retail, interface="catalog").system_prompts == ()
    # mined from the requests synthesis may read (the train split: phrasing_from), not from the seeds alone
    assert build_grounding(prompted_logs, phrasing_from=logs).system_prompts == ()
    assert build_grounding(logs[:3], phrasing_from=prompted_logs).system_prompts == mined.system_prompts
    # a tool set whose requests mostly had no system message is prompted without one
    mostly_none = [t if i < 12 else prompted_logs[i] for i, t in enumerate(logs)]
    assert build_grounding(mostly_none).system_prompts[0]["content"] == ""

    sets = replace(grounding, system_prompts=(
        {"tools": ["a", "b", "c"], "content": "P-abc", "requests": 5},
        {"tools": ["a", "b", "c", "d", "e"], "content": "P-wide", "requests": 2},
        {"tools": ["d", "e"], "content": "P-de", "requests": 3},
        {"tools": ["f"], "content": "", "requests": 4},
    ))
    assert system_prompt_for(sets, ["a"]) == "P-abc"  # both sets offered it: the more common one
    assert system_prompt_for(sets, ["d"]) == "P-de"  # tie on coverage and count 3 > 2
    assert system_prompt_for(sets, ["a", "d"]) == "P-wide"  # only that set offered both
    assert system_prompt_for(sets, ["d", "e", "f"]) == "P-de"  # no set offered all: the largest overlap
    assert system_prompt_for(sets, ["f"]) == "" and system_prompt_for(sets, ["zz"]) == ""


def test_native_tasks_open_with_the_logged_system_prompt(prompted_tasks, tasks, prompted_logs, tmp_path):
    from traceops.agent import run_episodes
    from traceops.envs.export import demonstrations
    from traceops.envs.synthesize import SynthesisParams, synthesize

    assert all("system_prompt" not in t for family_tasks in tasks.values() for t in family_tasks)
    for name, family_tasks in prompted_tasks.items():
        family = FAMILIES[name]
        env = family.make_env()
        for task in family_tasks:
            assert task["system_prompt"] == AGENT_PROMPT
            env.reset(**task)
            assert env.tools_vary() and env.system_prompt == AGENT_PROMPT
            assert demonstrations(env, task)[:2] == opening(task)
        env.reset(**tasks[name][0])  # the same environment on a task of logs without one: no prompt left over
        assert env.system_prompt == ""
        assert self_test(family, family_tasks[:8])["passed"]
    selection = prompted_tasks["tool_selection"][:4]
    trajectories = run_episodes(_GoldAgent(selection), FAMILIES["tool_selection"].make_env, selection,
                                max_turns=3, batch_size=4)
    assert [t.outcome.reward for t in trajectories] == [1.0] * 4
    assert all(t.messages[0] == Message(role="system", content=AGENT_PROMPT) for t in trajectories)
    synthesize(["tool_selection"], prompted_logs, tmp_path, SynthesisParams(train_size=6, val_size=2,
                                                                            test_size=2))
    lines = (tmp_path / "tool_selection" / "train.jsonl").read_text().splitlines()
    written = [json.loads(line) for line in lines]
    assert len(written) == 6 and all(t["system_prompt"] == AGENT_PROMPT for t in written)


def test_catalog_export_is_unchanged_and_native_export_needs_the_tokenizer(logs, prompted_tasks):
    from traceops.envs.export import dataset_rows, to_dataset
    from traceops.errors import ConfigError

    retail = build_grounding([t.model_copy(update={"domain": "retail"}) for t in logs], interface="catalog")
    family = FAMILIES["tool_selection"]
    catalog = family.generate(retail, 0, 4)
    assert to_dataset(catalog, family).to_list() == dataset_rows(catalog, family.env_class.system_prompt)
    with pytest.raises(ConfigError, match="brings its own tools"):
        to_dataset(prompted_tasks["tool_selection"][:2], family)
    with pytest.raises(ConfigError, match="some tasks bring their own tools"):
        to_dataset([*catalog[:1], *prompted_tasks["tool_selection"][:1]], family, tokenizer=object())


def test_grpo_rollout_prompt_is_the_sft_demo_prompt_and_the_served_prompt(prompted_tasks, tmp_path,
                                                                          tiny_model_dir):
    """Token ids: what TRL's GRPOTrainer (built as training builds it) feeds the policy for a native task ==
    the start of its SFT demonstration's sequence == the served prompt (render_prompt as the server and
    the agent loop send it, and as a trained adapter renders it)."""
    from dataclasses import replace

    from transformers import AutoModelForCausalLM

    from traceops.model.adapted import training_conversation
    from traceops.model.chat_template import load_tokenizer
    from traceops.model.toolcalls import render_prompt
    from traceops.train.budgets import BUDGETS
    from traceops.train.data import grpo_rows, load_environment_set, sft_rows
    from traceops.train.grpo import build_grpo_trainer
    from traceops.train.sft import assistant_mask

    chosen = prompted_tasks["tool_selection"][:3]
    env_set = load_environment_set(_write_folder(tmp_path / "sel", "tool_selection", chosen))
    tokenizer = load_tokenizer(str(tiny_model_dir))
    rows = grpo_rows(env_set, tokenizer, multi_turn=False)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    budget = replace(BUDGETS["tiny"], grpo_steps=1, save_steps=100)
    trainer = build_grpo_trainer(model, tokenizer, env_set, rows, budget, tmp_path / "grpo", 0,
                                 multi_turn=False)
    rollout_ids, _, _ = trainer._tokenize_prompts([row["prompt"] for row in rows])
    for task, ids, sft in zip(env_set.tasks("train"), rollout_ids, sft_rows(env_set), strict=True):
        served = render_prompt(tokenizer, opening(task), task["tools"])
        served_ids = tokenizer(served, add_special_tokens=False)["input_ids"]
        demo_ids, mask = assistant_mask(tokenizer, sft["messages"], json.loads(sft["tools"]))
        assert list(ids) == served_ids == demo_ids[: len(served_ids)]
        # the demo's loss starts at the end of that prompt (TRL's training template counts the newline
        # after "<|im_start|>assistant", which the generation prompt already holds, as the reply's)
        assert mask.index(1) == len(served_ids) - 1
        assert AGENT_PROMPT in tokenizer.decode(ids)
        assert render_prompt(tokenizer, training_conversation(opening(task)), task["tools"]) == served
