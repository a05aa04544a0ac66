"""The trajectory data model (DESIGN.md, Contracts). Plain pydantic classes, no hidden logic.

Field names follow tau2-bench's data model where they overlap. A trajectory's ``id`` is the content
hash of everything but its ``id`` and ``source``, so the same run read from two files is one record.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from traceops.hashing import content_hash

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
FULL_REWARD = 1.0  # the verifier's full score: a run that earns less has failed


class ToolCall(BaseModel):
    """One tool call an assistant message makes.

    ``arguments`` is always an object. When the source gave arguments that do not parse as a JSON
    object, they are kept verbatim in ``raw_arguments`` and ``arguments`` is empty: a malformed call is
    evidence of a capability gap, never dropped.
    """

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw_arguments: str | None = None


class Message(BaseModel):
    """One step of a trajectory: a system, user, assistant or tool message."""

    model_config = ConfigDict(extra="forbid")

    role: Role
    name: str | None = None
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class ToolSpec(BaseModel):
    """A tool as the agent saw it: name, description and JSON-schema parameters."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class Outcome(BaseModel):
    """How the run ended. ``success`` None means the source did not say; ``succeeded`` and ``failed``
    are the one rule every stage judges a run by (ingest, diagnosis, grounding, evaluation)."""

    model_config = ConfigDict(extra="forbid")

    success: bool | None = None
    reward: float | None = None
    reward_breakdown: dict[str, float] = Field(default_factory=dict)

    @property
    def succeeded(self) -> bool | None:
        """``success`` when the source gave it, else whether the reward is the full reward (1.0); None
        when neither is known (the outcome is unknown, neither a success nor a failure)."""
        if self.success is not None:
            return self.success
        return None if self.reward is None else self.reward >= FULL_REWARD

    @property
    def failed(self) -> bool:
        """Whether the run failed: it did not succeed by ``succeeded``'s rule (unknown is not failed)."""
        return self.succeeded is False


class Source(BaseModel):
    """Where a trajectory was read from: format, file and record (line or index) within the file."""

    model_config = ConfigDict(extra="forbid")

    format: str
    file: str
    record: int | str


class Label(BaseModel):
    """A capability judgement on a trajectory, optionally pinned to a step.

    ``source`` says who labelled it: ``planted`` (ground truth of the planted-gap agent), ``rule``,
    ``embedding``, ``llm`` or a reader's own name.
    """

    model_config = ConfigDict(extra="forbid")

    source: str
    capability: str
    step: int | None = None
    rationale: str | None = None


class Trajectory(BaseModel):
    """One agent run: the messages it exchanged, the tools it had and how it ended."""

    model_config = ConfigDict(extra="forbid")

    id: str = ""
    task_id: str
    domain: str = "unknown"
    agent: str = "unknown"
    tools: list[ToolSpec] = Field(default_factory=list)
    messages: list[Message]
    outcome: Outcome = Field(default_factory=Outcome)
    source: Source
    labels: list[Label] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _fill_id(self) -> Trajectory:
        """Derive the content-hash id when the source gave none."""
        if not self.id:
            self.id = trajectory_hash(self)
        return self


def trajectory_hash(trajectory: Trajectory) -> str:
    """Content hash of a trajectory: everything except ``id`` and ``source``."""
    return content_hash(trajectory.model_dump(mode="json", exclude={"id", "source"}))
