"""``RetailEnv``: the retail domain as an ``Environment``: tools, policy, scripted user and verifier."""

from __future__ import annotations

from typing import Any

from traceops.domains.retail.policy import POLICY
from traceops.domains.retail.task import Task
from traceops.domains.retail.tasks import get_task
from traceops.domains.retail.tools import RetailTools
from traceops.domains.retail.user import ScriptedUser
from traceops.domains.retail.verifier import fresh_database, score
from traceops.envs.base import AssistantTurn, Environment, not_a_tool
from traceops.errors import ConfigError


class RetailEnv(RetailTools, Environment):
    """One retail episode at a time: ``reset(task_id=...)``, tool calls, ``respond``, ``get_reward``."""

    system_prompt = POLICY

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._start({})
        self.task: Task | None = None
        self._customer: ScriptedUser | None = None
        self._said: list[str] = []
        self._calls = 0

    def reset(self, task_id: str = "", **columns: Any) -> str:
        """Start the task ``task_id`` on a fresh copy of the database; returns the customer's first message.

        Other keyword arguments are ignored: TRL passes every dataset column to ``reset``.
        """
        if not task_id:
            raise ConfigError("RetailEnv.reset needs task_id=...; take it from Task.spec()")
        self.task = get_task(self.seed, task_id)
        self._start(fresh_database(self.seed))
        self._customer = ScriptedUser(self.task.instruction, self.task.facts)
        self._said = []
        self._calls = 0
        return self._customer.opening()

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call (counted, for out-of-scope tasks) and return its observation."""
        self._calls += 1
        return super().call_tool(name, arguments)

    def respond(self, text: str) -> str | None:
        """Record an assistant message for the verifier; the scripted customer's reply, or None to end."""
        self._said.append(text or "")
        return self._customer.reply(text or "") if self._customer is not None else None

    @not_a_tool
    def reward_breakdown(self) -> dict[str, float]:
        """Per-check scores: ``db``, ``communicate`` and, for out-of-scope tasks, ``no_tool_use``."""
        if self.task is None:
            raise ConfigError("RetailEnv: call reset(task_id=...) before asking for the reward")
        return score(self.seed, self.task, self.db, self.touched, self._said, self._calls)

    def get_reward(self) -> float:
        """1.0 when every check of ``reward_breakdown`` passes, else 0.0."""
        return float(all(value == 1.0 for value in self.reward_breakdown().values()))

    def oracle(self) -> list[AssistantTurn]:
        """The task's gold dialogue (it scores 1.0)."""
        if self.task is None:
            raise ConfigError("RetailEnv: call reset(task_id=...) before asking for the oracle")
        return list(self.task.turns)
