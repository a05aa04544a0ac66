"""The planted-gap agent: a ChatModel that plays each task's gold dialogue and injects failures of
named capability types at configurable rates, recording each one as a ground-truth Label.

It recognises its episode by the first user message (the task instruction: unique per domain), so
one instance serves a whole batch of concurrent episodes. The failure to inject into a task is
drawn once from ``random.Random(f"{seed}:{task.id}")``: same seed, same episodes, same labels.

Every injected failure is unrecovered, so it scores below 1.0: after a lost step (malformed call,
wrong tool, ungrounded argument, unrecovered error) the agent gives up without the facts asked for
and without the remaining writes; a skipped write, a write on the wrong order, a forbidden write or
a tool call on an out-of-scope request changes what the verifier checks. Without injection the
agent is the oracle and scores 1.0 on every task.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from traceops.domains.retail.task import WRITE_TOOLS, Task
from traceops.envs.base import AssistantTurn, Call
from traceops.errors import ConfigError
from traceops.hashing import content_hash
from traceops.model.base import GenerationConfig, ModelInfo
from traceops.model.toolcalls import assistant_text, render_tool_call
from traceops.schema import Label

CAPABILITIES = (
    "tool_call_format", "tool_selection", "argument_grounding", "multi_step_transaction",
    "policy_adherence", "error_recovery", "irrelevance_refusal", "state_tracking",
)
DEFAULT_RATES = {
    "tool_call_format": 0.08, "tool_selection": 0.06, "argument_grounding": 0.08,
    "multi_step_transaction": 0.15, "policy_adherence": 0.5, "error_recovery": 0.5,
    "irrelevance_refusal": 0.4, "state_tracking": 0.5,
}
GIVE_UP = "I'm sorry, I wasn't able to complete your request."
CLOSING = "Thank you for contacting us."
CONFUSED_WITH = {  # the wrong tool the agent reaches for instead of each gold tool
    "find_user_by_email": "find_user_by_name_zip", "find_user_by_name_zip": "find_user_by_email",
    "get_order_details": "list_user_orders", "list_user_orders": "get_user_details",
    "get_user_details": "list_user_orders", "get_product_details": "get_order_details",
    "list_products": "list_user_orders", "cancel_pending_order": "return_delivered_order_items",
    "modify_pending_order_address": "update_user_address",
    "update_user_address": "modify_pending_order_address",
    "return_delivered_order_items": "exchange_delivered_order_items",
    "exchange_delivered_order_items": "return_delivered_order_items",
    "transfer_to_human_agents": "get_user_details",
}
ID_ARGUMENTS = ("order_id", "user_id", "email", "product_id", "item_id", "item_ids", "new_sku")


@dataclass(frozen=True)
class Injection:
    """One planted failure: its capability, the index of the assistant turn it is in, and why."""

    capability: str
    turn: int
    rationale: str


@dataclass(frozen=True)
class Plan:
    """An episode's script (assistant texts, in order) and the failure planted in it, if any."""

    texts: tuple[str, ...]
    injection: Injection | None


def _render(turn: AssistantTurn) -> str:
    return assistant_text(turn.content, [(c.name, dict(c.arguments)) for c in turn.calls])


def _call_turn(call: Call) -> AssistantTurn:
    return AssistantTurn(calls=(call,))


def _call_turns(task: Task) -> list[int]:
    return [i for i, turn in enumerate(task.turns) if turn.calls]


def _write_turns(task: Task) -> list[int]:
    return [i for i in _call_turns(task)
            if task.turns[i].calls[0].name in WRITE_TOOLS and i != task.error_turn]


def _malformed(call: Call, rng: random.Random) -> str:
    """A tool call whose JSON does not parse: a missing brace, a stray comma or an unquoted key."""
    text = render_tool_call(call.name, dict(call.arguments))
    variants = [text.replace("}}</tool_call>", "}</tool_call>"),
                text.replace('"arguments": {', '"arguments": {,')]
    if call.arguments:
        key = sorted(call.arguments)[0]
        variants.append(text.replace(f'"{key}":', f"{key}:", 1))
    return rng.choice(variants)


def _ungrounded(name: str, rng: random.Random) -> Any:
    """A plausible value for an id argument that nothing in the conversation grounds (and no row has)."""
    digits = rng.randint(0, 999999)
    if name == "order_id":
        return f"#W0{digits:06d}"
    if name == "user_id":
        return f"user_9{digits % 1000:03d}"
    if name == "email":
        return f"customer{digits % 1000}@example.org"
    if name == "product_id":
        return f"prod_9{digits % 100:02d}"
    if name == "item_id":
        return f"item_0{digits:06d}_1"
    if name == "item_ids":
        return [f"item_0{digits:06d}_1"]
    return f"sku_9{digits % 10000:04d}"


def applies(capability: str, task: Task) -> bool:
    """Whether a failure of ``capability`` can be planted in ``task``."""
    calls = _call_turns(task)
    if capability in ("tool_call_format", "tool_selection"):
        return bool(calls)
    if capability == "argument_grounding":
        return any(set(task.turns[i].calls[0].arguments) & set(ID_ARGUMENTS) for i in calls)
    if capability == "multi_step_transaction":
        return len(calls) >= 2 and bool(_write_turns(task))
    if capability == "policy_adherence":
        return task.forbidden is not None
    if capability == "error_recovery":
        return task.error_turn is not None
    if capability == "irrelevance_refusal":
        return task.no_tools
    if capability == "state_tracking":
        orders = {task.turns[i].calls[0].arguments.get("order_id") for i in _write_turns(task)}
        return len(orders - {None}) >= 2
    raise ConfigError(f"unknown planted capability {capability!r}; valid: {', '.join(CAPABILITIES)}")


def _plant(task: Task, capability: str, rng: random.Random) -> Plan:
    """The script of ``task`` with one failure of ``capability`` planted (``applies`` must hold)."""
    turns = list(task.turns)
    gold = [_render(t) for t in turns]
    if capability == "tool_call_format":
        i = rng.choice(_call_turns(task))
        call = turns[i].calls[0]
        return Plan((*gold[:i], _malformed(call, rng)),
                    Injection(capability, i, f"malformed tool-call JSON for {call.name}"))
    if capability == "tool_selection":
        i = rng.choice(_call_turns(task))
        call = turns[i].calls[0]
        wrong = Call(CONFUSED_WITH[call.name], dict(call.arguments))
        return Plan((*gold[:i], _render(_call_turn(wrong)), GIVE_UP),
                    Injection(capability, i, f"called {wrong.name} where {call.name} was needed"))
    if capability == "argument_grounding":
        choices = [i for i in _call_turns(task) if set(turns[i].calls[0].arguments) & set(ID_ARGUMENTS)]
        i = rng.choice(choices)
        call = turns[i].calls[0]
        key = rng.choice(sorted(set(call.arguments) & set(ID_ARGUMENTS)))
        made_up = Call(call.name, {**call.arguments, key: _ungrounded(key, rng)})
        return Plan((*gold[:i], _render(_call_turn(made_up)), GIVE_UP),
                    Injection(capability, i, f"{call.name}: {key}={made_up.arguments[key]!r} is not grounded "
                                             "in the conversation"))
    if capability == "multi_step_transaction":
        i = rng.choice(_write_turns(task))
        skipped = turns[i].calls[0]
        return Plan((*gold[:i], *gold[i + 1:]),
                    Injection(capability, i, f"skipped the {skipped.name} step of a multi-step task"))
    if capability == "policy_adherence":
        assert task.forbidden is not None
        i = len(turns) - 1
        done = "Done: I've taken care of that for you."
        return Plan((*gold[:i], _render(_call_turn(task.forbidden)), done),
                    Injection(capability, i, f"performed {task.forbidden.name}, which the policy forbids"))
    if capability == "error_recovery":
        assert task.error_turn is not None
        e = task.error_turn
        repeat = (gold[e],) if rng.random() < 0.5 else ()
        return Plan((*gold[:e + 1], *repeat, GIVE_UP),
                    Injection(capability, e + 1, "did not recover from the tool error" +
                              (": repeated the failing call" if repeat else ": gave up")))
    if capability == "irrelevance_refusal":
        call = rng.choice([Call("list_products", {}),
                           Call("find_user_by_email", {"email": _ungrounded("email", rng)})])
        return Plan((_render(_call_turn(call)), *gold),
                    Injection(capability, 0, f"called {call.name} on an out-of-scope request"))
    if capability == "state_tracking":
        writes = [i for i in _write_turns(task) if "order_id" in turns[i].calls[0].arguments]
        first, later = writes[0], writes[-1]
        stale = turns[first].calls[0].arguments["order_id"]
        call = turns[later].calls[0]
        wrong = Call(call.name, {**call.arguments, "order_id": stale})
        return Plan((*gold[:later], _render(_call_turn(wrong)), *gold[later + 1:]),
                    Injection(capability, later, f"reused {stale} from an earlier step instead of "
                                                 f"{call.arguments['order_id']}"))
    raise ConfigError(f"unknown planted capability {capability!r}; valid: {', '.join(CAPABILITIES)}")


def check_rates(rates: dict[str, float]) -> dict[str, float]:
    """Validated rates: known capabilities, each in [0, 1]."""
    unknown = sorted(set(rates) - set(CAPABILITIES))
    if unknown:
        raise ConfigError(f"planted rates: unknown capabilities {unknown}; valid: {', '.join(CAPABILITIES)}")
    bad = {k: v for k, v in rates.items() if not 0.0 <= float(v) <= 1.0}
    if bad:
        raise ConfigError(f"planted rates must be between 0 and 1, got {bad}")
    return {k: float(v) for k, v in rates.items()}


class PlantedAgent:
    """A ChatModel that follows each task's gold dialogue, with failures planted at ``rates``.

    ``rates[c]`` is the probability that an episode whose task admits capability ``c`` gets a
    failure of type ``c``; the applicable rates share one draw (cumulatively, scaled down when
    they sum above 1), so at most one failure is planted per episode.
    """

    def __init__(self, tasks: Sequence[Task], rates: dict[str, float] | None = None, seed: int = 0) -> None:
        self.rates = check_rates(DEFAULT_RATES if rates is None else rates)
        self.seed = seed
        self._tasks: dict[str, Task] = {}
        for task in tasks:
            if task.instruction in self._tasks and self._tasks[task.instruction].id != task.id:
                raise ConfigError(f"planted agent: tasks {self._tasks[task.instruction].id} and {task.id} "
                                  "share an instruction; it cannot tell their episodes apart")
            self._tasks[task.instruction] = task
        self._plans: dict[str, Plan] = {}
        self.info = ModelInfo(model_id="traceops/planted-gap-agent",
                              weights_hash=content_hash({"rates": self.rates, "seed": seed}, length=32),
                              extra={"backend": "planted", "rates": dict(self.rates), "seed": seed})

    def plan(self, task: Task) -> Plan:
        """The script and planted failure of ``task``'s episode (drawn once per task and seed)."""
        if task.id not in self._plans:
            rng = random.Random(f"{self.seed}:{task.id}")
            applicable = [(c, self.rates.get(c, 0.0)) for c in CAPABILITIES
                          if self.rates.get(c, 0.0) > 0 and applies(c, task)]
            total = sum(rate for _, rate in applicable)
            draw = rng.random() * max(1.0, total)
            chosen = None
            for capability, rate in applicable:
                if draw < rate:
                    chosen = capability
                    break
                draw -= rate
            self._plans[task.id] = (_plant(task, chosen, rng) if chosen else
                                    Plan(tuple(_render(t) for t in task.turns), None))
        return self._plans[task.id]

    def _task_of(self, conversation: list[dict[str, Any]]) -> Task | None:
        first = next((m.get("content") for m in conversation if m.get("role") == "user"), None)
        return self._tasks.get(first) if isinstance(first, str) else None

    def generate(self, conversations: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None = None,
                 config: GenerationConfig | None = None) -> list[str]:
        """The next scripted assistant text of each conversation."""
        texts = []
        for conversation in conversations:
            task = self._task_of(conversation)
            if task is None:
                texts.append(GIVE_UP)
                continue
            script = self.plan(task).texts
            turn = sum(1 for m in conversation if m.get("role") == "assistant")
            texts.append(script[turn] if turn < len(script) else CLOSING)
        return texts

    def episode_labels(self, conversation: list[dict[str, Any]]) -> list[Label]:
        """The planted failure of a finished episode, pinned to the message where it happened."""
        task = self._task_of(conversation)
        injection = self.plan(task).injection if task is not None else None
        if injection is None:
            return []
        assistant_steps = [i for i, m in enumerate(conversation) if m.get("role") == "assistant"]
        if injection.turn >= len(assistant_steps):
            return []  # the episode ended (max turns) before the failure was reached
        return [Label(source="planted", capability=injection.capability, step=assistant_steps[injection.turn],
                      rationale=injection.rationale)]
