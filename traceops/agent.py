"""The agent loop: a ChatModel against any Environment, many episodes at once, each turn one batch.

Every live episode contributes its conversation to one ``model.generate`` call per turn. Tool calls
are parsed from the text (``model.toolcalls``), run through ``env.call_tool`` and answered with tool
messages; a turn without a call goes to ``env.respond`` (the scripted user), which answers or ends the
episode. Whatever the model emits, the episode ends in a Trajectory (a failed one when it is garbage).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from traceops.envs.base import Environment
from traceops.envs.calibration import Episodes
from traceops.envs.family import Family
from traceops.errors import ConfigError, ModelError
from traceops.model.base import ChatModel, GenerationConfig, tools_of_batch
from traceops.model.toolcalls import parse_tool_calls
from traceops.schema import FULL_REWARD, Label, Message, Outcome, Source, ToolCall, ToolSpec, Trajectory

SOURCE_FORMAT = "traceops-agent"
SOURCE_FILE = "<collect>"
STOP_MARK = "###STOP###"


@dataclass
class _Episode:
    """One running episode: its environment, its task and the messages so far."""

    index: int
    task: dict[str, Any]
    env: Environment
    messages: list[Message] = field(default_factory=list)
    turns: int = 0
    ended: str | None = None
    tools: tuple[list[dict[str, Any]], list[ToolSpec]] = ([], [])


def _chat(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages as OpenAI-style dicts (tool-call arguments as objects) for ``ChatModel.generate``."""
    return [message.model_dump(exclude_none=True) for message in messages]


def tool_specs_of(specs_or_env: Environment | list[dict[str, Any]]) -> list[ToolSpec]:
    """An environment's tools (or its OpenAI function specs) as schema ToolSpecs."""
    raw = specs_or_env.tool_specs() if isinstance(specs_or_env, Environment) else specs_or_env
    specs = []
    for spec in raw:
        function = spec.get("function", spec)
        specs.append(ToolSpec(name=function["name"], description=function.get("description", ""),
                              parameters=function.get("parameters") or {"type": "object", "properties": {}}))
    return specs


def _run_tool(env: Environment, name: str, arguments: dict[str, Any]) -> str:
    """One tool call's observation. ``call_tool`` turns expected errors into text; a tool that raises
    anything else on model-made arguments must still not end the whole batch, so it becomes text too."""
    try:
        return env.call_tool(name, arguments)
    except Exception as exc:  # noqa: BLE001 - arbitrary environment code on arbitrary model output
        return f"Error: tool '{name}' failed: {type(exc).__name__}: {exc}"


def _step(episode: _Episode, text: str, max_turns: int) -> None:
    """Apply one assistant output to its episode: run its calls, or hand its text to the user."""
    episode.turns += 1
    try:
        parsed = parse_tool_calls(text or "")
        calls = list(parsed.calls)
    except Exception:  # noqa: BLE001 - a parser failure on garbage is a turn without calls, not a crash
        calls = []
    if calls:
        tool_calls = [ToolCall(id=f"call_{episode.index}_{episode.turns}_{k}", name=str(c.name),
                               arguments=dict(c.arguments)) for k, c in enumerate(calls)]
        episode.messages.append(Message(role="assistant", content=parsed.content or None,
                                        tool_calls=tool_calls))
        for call in tool_calls:
            observation = _run_tool(episode.env, call.name, dict(call.arguments))
            episode.messages.append(Message(role="tool", name=call.name, content=observation,
                                            tool_call_id=call.id))
    else:
        episode.messages.append(Message(role="assistant", content=text or ""))
        reply = episode.env.respond(text or "")
        if reply is None or STOP_MARK in reply:
            episode.ended = "user_stop"
            return
        episode.messages.append(Message(role="user", content=reply))
    if episode.turns >= max_turns:
        episode.ended = "max_turns"


def _labels(model: ChatModel, messages: list[Message]) -> list[Label]:
    """Ground-truth labels from models that know them (the planted-gap agent's ``episode_labels``)."""
    labeller = getattr(model, "episode_labels", None)
    return list(labeller(_chat(messages))) if callable(labeller) else []


def _finish(model: ChatModel, episode: _Episode, domain: str, record: int,
            tools: list[ToolSpec]) -> Trajectory:
    env = episode.env
    reward = float(env.get_reward())
    breakdown_of = getattr(env, "reward_breakdown", None)
    breakdown = {str(k): float(v) for k, v in breakdown_of().items()} if callable(breakdown_of) else {}
    task_id = str(episode.task.get("task_id") or episode.task.get("id") or f"task-{episode.index}")
    return Trajectory(
        task_id=task_id,
        domain=domain,
        agent=model.info.model_id,
        tools=tools,
        messages=episode.messages,
        outcome=Outcome(success=reward >= FULL_REWARD, reward=reward, reward_breakdown=breakdown),
        source=Source(format=SOURCE_FORMAT, file=SOURCE_FILE, record=record),
        labels=_labels(model, episode.messages),
        metadata={"turns": episode.turns, "ended": episode.ended},
    )


def run_episodes(model: ChatModel, env_factory: Callable[[], Environment], tasks: Sequence[dict[str, Any]],
                 max_turns: int = 12, config: GenerationConfig | None = None, batch_size: int = 8,
                 domain: str = "unknown", progress: Callable[[int], None] | None = None) -> list[Trajectory]:
    """Run one episode per task spec (``env.reset(**spec)``) and return their trajectories in task order.

    Up to ``batch_size`` episodes run at once; each turn, the conversations of all live episodes go to
    the model in one ``generate`` call, and a finished episode's slot goes to the next task. An episode
    ends when the user (``env.respond``) ends it or after ``max_turns`` assistant turns. ``progress``
    is called with the number of episodes finished so far.
    """
    if batch_size < 1 or max_turns < 1:
        raise ConfigError(f"batch_size and max_turns must be at least 1, got {batch_size} and {max_turns}")
    config = config or GenerationConfig()
    pending = list(enumerate(tasks))
    pending.reverse()
    live: list[_Episode] = []
    results: dict[int, Trajectory] = {}
    # Tool specs come from type hints and docstrings: derive them once per environment class.
    specs: dict[type, tuple[list[dict[str, Any]], list[ToolSpec]]] = {}
    while pending or live:
        while pending and len(live) < batch_size:
            index, task = pending.pop()
            env = env_factory()
            first = env.reset(**task)
            if env.tools_vary():  # the task's own tools (a domain's logged tools, offered natively)
                functions = env.tool_specs()
                tools = (functions, tool_specs_of(functions))
            else:
                if type(env) not in specs:
                    functions = env.tool_specs()
                    specs[type(env)] = (functions, tool_specs_of(functions))
                tools = specs[type(env)]
            messages = [Message(role="system", content=env.system_prompt)] if env.system_prompt else []
            messages.append(Message(role="user", content=first))
            live.append(_Episode(index=index, task=dict(task), env=env, messages=messages, tools=tools))
        # One call per turn, each episode with its own tools (tasks may bring their own); episodes with
        # equal tools side by side, so the backend's shared-prefix cache computes their prefix once.
        group = sorted(live, key=lambda e: json.dumps(e.tools[0], sort_keys=True))
        texts = model.generate([_chat(e.messages) for e in group],
                               tools=tools_of_batch([e.tools[0] for e in group]), config=config)
        if len(texts) != len(group):
            raise ModelError(f"{model.info.model_id}: generate returned {len(texts)} texts for "
                             f"{len(group)} conversations")
        for episode, text in zip(group, texts, strict=True):
            _step(episode, text if isinstance(text, str) else json.dumps(text), max_turns)
        for episode in [e for e in live if e.ended]:
            results[episode.index] = _finish(model, episode, domain, episode.index, episode.tools[1])
            live.remove(episode)
            if progress is not None:
                progress(len(results))
    return [results[index] for index in range(len(tasks))]


def agent_episodes(model: Any, family: Family, *, max_turns: int = 8, config: Any = None,
                   batch_size: int = 8) -> Episodes:
    """Calibration's episodes callable for a chat model: ``run_episodes`` over a family's environments
    (rewards from the trajectories)."""

    def run(tasks: Sequence[dict[str, Any]]) -> list[Any]:
        return list(run_episodes(model, family.make_env, list(tasks), max_turns, config, batch_size))

    return run


def model_episodes(model_spec: str) -> Callable[[Family], Episodes]:
    """Calibration's per-family episodes for the model ``model_spec`` names (a folder, ``embedded`` or an
    OpenAI-compatible URL; loaded once with ``traceops.model.load_model``)."""
    from traceops.model import load_model

    model = load_model(model_spec)
    return lambda family: agent_episodes(model, family)
