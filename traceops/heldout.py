"""Held-out real requests: the logged requests no training stage may see, and their references.

Logged trajectories are split by ``task_id`` into train and held-out: a task is held out when the hash
of ``(seed, task_id)`` falls below ``fraction``. The decision depends on the task alone, so it is the
same whatever else the logs hold (a task held out tonight stays held out as logs grow), and every
trajectory of a task lands on the same side (retries of one request never straddle the split). A
train-side trajectory whose request holds the same user words as a held-out request (one request logged
under two task ids, as BFCL's categories share some questions) is left out of training: training never
sees a held-out request's words.

A *logged request* is what the agent was asked at one assistant turn: the messages before that turn
and the tools it had. It is the first assistant turn that calls a tool (the first assistant turn when
none does; the whole conversation when there is no assistant turn). Its references are the logged
replies at that turn of the task's runs that succeeded (``Outcome.succeeded``), so the held-out set
includes what the agent already did right, plus any replies a user's reference file gives for the
task (JSONL, one ``{"task_id": ..., "reply": {assistant message}}`` per line; several lines for one
task are alternatives, a reply is scored by the best of them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from traceops.errors import ConfigError, InputError
from traceops.hashing import content_hash, file_hash
from traceops.schema import Message, ToolSpec, Trajectory

_HASH_CHARS = 16  # content_hash's hex length: the split draws a number in [0, 1) from it


DEFAULT_GRADER = "default"  # the graders key for every domain not named


@dataclass(frozen=True)
class RequestParams:
    """Settings of held-out real requests (``params.yaml`` ``evaluate.requests``).

    ``heldout_fraction`` of the tasks (by the ``seed``ed hash) never reach training and are replayed by
    evaluation, at most ``limit`` with a reference per domain (None: all); ``references`` a JSONL file
    of reference replies (None: only the logs' own successes); ``graders`` maps a domain to its
    grader spec (``traceops.graders.load_grader``), ``default`` for the other domains.
    """

    heldout_fraction: float = 0.2
    seed: int = 0
    limit: int | None = 32
    references: str | None = None
    graders: dict[str, str] = field(default_factory=lambda: {DEFAULT_GRADER: "tool_call_match"})

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None) -> RequestParams:
        """The settings from a ``requests`` mapping; unknown keys and bad values are ConfigErrors."""
        if params is not None and not isinstance(params, Mapping):
            raise ConfigError(f"params.yaml evaluate.requests is {params!r}; give a mapping "
                              "(heldout_fraction, seed, limit, references, graders)")
        values = dict(params or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"params.yaml evaluate.requests: unknown key(s) {unknown}; "
                              f"known: {sorted(known)}")
        merged = {**asdict(cls()), **values}
        graders = merged["graders"]
        if not isinstance(graders, Mapping) or not all(isinstance(v, str) and v for v in graders.values()):
            raise ConfigError(f"params.yaml evaluate.requests.graders is {graders!r}; map each domain (and "
                              "'default') to a grader spec such as tool_call_match")
        try:
            chosen = cls(heldout_fraction=float(merged["heldout_fraction"]), seed=int(merged["seed"]),
                         limit=None if merged["limit"] is None else int(merged["limit"]),
                         references=None if merged["references"] is None else str(merged["references"]),
                         graders={DEFAULT_GRADER: "tool_call_match",
                                  **{str(k): v for k, v in graders.items()}})
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"params.yaml evaluate.requests: {exc}; heldout_fraction is a number, seed "
                              "a whole number, limit a whole number or null, references a path or "
                              "null") from None
        if not 0.0 <= chosen.heldout_fraction < 1.0:
            raise ConfigError(f"params.yaml evaluate.requests.heldout_fraction is {chosen.heldout_fraction}; "
                              "use a number in [0, 1) (0 holds nothing out)")
        if chosen.limit is not None and chosen.limit < 1:
            raise ConfigError(f"params.yaml evaluate.requests.limit is {chosen.limit}; use at least 1 "
                              "or null")
        return chosen

    def grader_spec(self, domain: str) -> str:
        """The grader spec of ``domain``: its own entry, else ``default``."""
        return self.graders.get(domain) or self.graders.get(DEFAULT_GRADER) or "tool_call_match"

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (MLflow params, cache key)."""
        return asdict(self)

    def cache_identity(self) -> dict[str, Any]:
        """What a stage's cache key needs from these settings: the settings and the reference file's
        content (an edited reference file must not reuse results graded against the old one)."""
        path = Path(self.references) if self.references else None
        return {**self.as_dict(), "references_hash": file_hash(path) if path and path.is_file() else None}


def heldout_score(task_id: str, seed: int) -> float:
    """Where ``task_id`` falls in [0, 1) under ``seed``: a seeded hash, so the same for every caller."""
    return int(content_hash({"seed": int(seed), "task_id": str(task_id)}, _HASH_CHARS), 16) / 16**_HASH_CHARS


def is_heldout(task_id: str, seed: int, fraction: float) -> bool:
    """Whether the task ``task_id`` is held out from training under ``seed`` and ``fraction``."""
    return heldout_score(task_id, seed) < fraction


def _check_fraction(fraction: float) -> float:
    value = float(fraction)
    if not 0.0 <= value < 1.0:
        raise InputError(f"held-out fraction is {fraction!r}; set evaluate.requests.heldout_fraction in "
                         "params.yaml to a number in [0, 1) (0 holds nothing out)")
    return value


def split_trajectories(trajectories: Iterable[Trajectory], seed: int,
                       fraction: float) -> tuple[list[Trajectory], list[Trajectory]]:
    """``(train, held_out)``: the trajectories split by task (see the module docstring), order kept."""
    fraction = _check_fraction(fraction)
    train: list[Trajectory] = []
    held: list[Trajectory] = []
    for trajectory in trajectories:
        (held if is_heldout(trajectory.task_id, seed, fraction) else train).append(trajectory)
    held_words = {words for words in map(request_words, held) if any(words)}
    return [t for t in train if request_words(t) not in held_words], held


def request_words(trajectory: Trajectory) -> tuple[str, ...]:
    """The user messages of a trajectory's request (before its request turn), whitespace-trimmed."""
    step = request_step(trajectory)
    return tuple(str(m.content or "").strip() for m in trajectory.messages[:step] if m.role == "user")


def train_trajectories(trajectories: Iterable[Trajectory], seed: int, fraction: float) -> list[Trajectory]:
    """The trajectories training stages may see: those of tasks not held out."""
    return split_trajectories(trajectories, seed, fraction)[0]


def _scalars(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _scalars(item)
    elif isinstance(value, list):
        for item in value:
            yield from _scalars(item)
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
        yield str(value)


def request_values(trajectories: Iterable[Trajectory]) -> set[str]:
    """Every scalar tool-call argument value in ``trajectories``, as text: what synthesis passes as
    ``exclude`` so that no generated task reuses a held-out request's value."""
    return {value for trajectory in trajectories for message in trajectory.messages
            for call in message.tool_calls or [] for value in _scalars(call.arguments)}


class LoggedRequest(BaseModel):
    """One held-out request: what the agent was asked, with which tools, and the replies that count as
    right (``references``; empty when there is none, then ``skip`` says why)."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    domain: str
    trajectory_id: str
    where: str  # file:record of the logged run the request was taken from
    step: int  # index of the assistant turn answered (len(messages) when the log has no reply)
    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    references: list[Message] = Field(default_factory=list)
    skip: str | None = None


def request_step(trajectory: Trajectory) -> int:
    """The assistant turn a trajectory's request is taken at (see the module docstring)."""
    assistant = [i for i, m in enumerate(trajectory.messages) if m.role == "assistant"]
    calling = [i for i in assistant if trajectory.messages[i].tool_calls]
    if calling:
        return calling[0]
    return assistant[0] if assistant else len(trajectory.messages)


def _where(trajectory: Trajectory) -> str:
    return f"{trajectory.source.file}:{trajectory.source.record}"


def load_references(path: str | Path) -> dict[str, list[Message]]:
    """A user's reference file: task id -> alternative reference replies, in file order.

    Each non-blank line is ``{"task_id": str, "reply": {"content": ..., "tool_calls": [...]}}`` (the
    role defaults to assistant); a bad line raises InputError naming the file, line and field.
    """
    file = Path(path)
    if not file.is_file():
        raise InputError(f"reference file {file} does not exist; set evaluate.requests.references in "
                         "params.yaml to a JSONL file of {\"task_id\", \"reply\"} lines, or null")
    out: dict[str, list[Message]] = {}
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{file}:{number}: not JSON ({exc.msg}); write one JSON object per "
                             "line") from None
        if not isinstance(row, dict) or not isinstance(row.get("task_id"), (str, int)):
            raise InputError(f"{file}:{number}: field 'task_id' is missing or not a string; each line is "
                             "{\"task_id\": ..., \"reply\": {...}}")
        reply = row.get("reply")
        if not isinstance(reply, dict):
            raise InputError(f"{file}:{number}: field 'reply' must be an assistant message object "
                             "({\"content\": ..., \"tool_calls\": [...]})")
        try:
            message = Message.model_validate(_as_message(reply))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise InputError(f"{file}:{number}: field 'reply.{field}': {first['msg']}") from None
        if message.role != "assistant":
            raise InputError(f"{file}:{number}: field 'reply.role' is {message.role!r}; a reference reply "
                             "is an assistant message")
        out.setdefault(str(row["task_id"]), []).append(message)
    return out


def _as_message(reply: dict) -> dict:
    """A reply object as a Message's fields: role assistant by default; OpenAI-style tool calls
    (``{"function": {"name", "arguments": JSON string}}``) flattened, with ids when they have none."""
    data = {"role": "assistant", **reply}
    calls = []
    for index, call in enumerate(data.get("tool_calls") or []):
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            call = {"id": call.get("id"), **call["function"]}
        if isinstance(call, dict):
            call = dict(call)
            call["id"] = call.get("id") or f"ref_{index}"
            call.pop("type", None)
            if isinstance(call.get("arguments"), str):
                try:
                    call["arguments"] = json.loads(call["arguments"])
                except json.JSONDecodeError:
                    call["raw_arguments"], call["arguments"] = call["arguments"], {}
        calls.append(call)
    if "tool_calls" in data:
        data["tool_calls"] = calls or None
    return data


def logged_requests(trajectories: Sequence[Trajectory],
                    references: dict[str, list[Message]] | None = None) -> list[LoggedRequest]:
    """One request per task of ``trajectories`` (pass the held-out ones), ordered by task id.

    The request is taken from the task's first run by trajectory id (deterministic); its references
    are the logged replies of the task's succeeded runs at their request turn, then the reference
    file's replies for the task. A task with no user turn, or with no reference, is kept with
    ``skip`` saying why, so it is counted, never silently dropped.
    """
    by_task: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        by_task.setdefault(trajectory.task_id, []).append(trajectory)
    extra = references or {}
    out: list[LoggedRequest] = []
    for task_id in sorted(by_task):
        runs = sorted(by_task[task_id], key=lambda t: t.id)
        first = runs[0]
        step = request_step(first)
        refs: list[Message] = []
        for run in runs:
            at = request_step(run)
            if run.outcome.succeeded and at < len(run.messages):
                reply = run.messages[at]
                if reply not in refs:
                    refs.append(reply)
        refs += [r for r in extra.get(task_id, []) if r not in refs]
        messages = first.messages[:step]
        skip = None
        if not any(m.role == "user" for m in messages):
            skip = f"{_where(first)}: field 'messages': no user turn before the reply; nothing to replay"
        elif not refs:
            skip = "no reference: no logged run of the task succeeded and the reference file has none"
        out.append(LoggedRequest(task_id=task_id, domain=first.domain, trajectory_id=first.id,
                                 where=_where(first), step=step, messages=messages, tools=first.tools,
                                 references=refs, skip=skip))
    return out
