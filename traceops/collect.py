"""collect: run a model over a bundled domain's tasks and write the runs as OpenAI-chat JSONL logs.

The output is the format users' own logs come in, so ``traceops ingest`` reads collected runs like
any production log. ``model_spec`` is what ``traceops.model.load_model`` takes (``embedded``, a folder,
an endpoint URL) or ``planted`` for the planted-gap agent (ground-truth capability labels included).

    traceops collect --domain retail --model planted --tasks 320 --seed 0 --out data/raw/sample \
        --rates '{"tool_call_format": 0.16, "argument_grounding": 0.15, "policy_adherence": 1.0,
                  "error_recovery": 1.0}'
    traceops collect --domain retail --model embedded --tasks 80 --max-turns 2 \
        --max-new-tokens 48 --batch-size 16 --out data/raw/sample
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from traceops.agent import run_episodes
from traceops.domains import get_domain
from traceops.errors import ConfigError
from traceops.model.base import ChatModel, GenerationConfig
from traceops.planted import PlantedAgent, check_rates

PLANTED_SPEC = "planted"


@dataclass(frozen=True)
class CollectResult:
    """What a collect run produced: episode and success counts, the output folder and files."""

    episodes: int
    succeeded: int
    out: Path
    files: list[Path] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        """JSON-able summary (for ``--json``)."""
        return {"episodes": self.episodes, "succeeded": self.succeeded, "out": str(self.out),
                "files": [str(f) for f in self.files]}


def output_name(model_spec: str, domain: str) -> str:
    """``<model>-<domain>.jsonl``: ``embedded-retail.jsonl``, ``planted-retail.jsonl``, ``<folder>-...``."""
    text = str(model_spec).rstrip("/")
    stem = text if text in ("embedded", PLANTED_SPEC) else (text.split("#")[-1] if "#" in text else
                                                            Path(text).name or "model")
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', stem).strip('_') or 'model'}-{domain}.jsonl"


def make_model(model_spec: str, tasks: list, seed: int, planted_rates: dict[str, float] | None = None,
               batch_size: int = 8) -> ChatModel:
    """The model behind a spec: the planted-gap agent over ``tasks``, or ``load_model(spec)``."""
    if model_spec == PLANTED_SPEC:
        return PlantedAgent(tasks, rates=planted_rates, seed=seed)
    if planted_rates:
        raise ConfigError("planted rates only apply to --model planted")
    from traceops.model import load_model

    return load_model(model_spec, batch_size=batch_size)


def collect(domain: str, model_spec: str, n_tasks: int | None, out_dir: str | Path, seed: int = 0,
            planted_rates: dict[str, float] | None = None, max_turns: int = 12, max_new_tokens: int = 256,
            batch_size: int = 8, progress: Callable[[int], None] | None = None) -> CollectResult:
    """Run ``model_spec`` over the first ``n_tasks`` tasks of ``domain`` (its default count when None)
    and write ``<out_dir>/<model>-<domain>.jsonl``. ``seed`` seeds sampling and the planted failures."""
    chosen = get_domain(domain)
    tasks = chosen.tasks(n_tasks)
    model = make_model(model_spec, tasks, seed, planted_rates, batch_size)
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0, seed=seed)
    trajectories = run_episodes(model, chosen.make_env, [task.spec() for task in tasks], max_turns=max_turns,
                                config=config, batch_size=batch_size, domain=chosen.name, progress=progress)
    from traceops.formats.openai import write_jsonl

    out = Path(out_dir)
    path = out / output_name(model_spec, chosen.name)
    write_jsonl(trajectories, path)
    succeeded = sum(1 for t in trajectories if t.outcome.succeeded)
    return CollectResult(episodes=len(trajectories), succeeded=succeeded, out=out, files=[path])


def parse_rates(text: str | None) -> dict[str, float] | None:
    """Planted failure rates from a JSON object of capability to rate (None when empty)."""
    if not text:
        return None
    try:
        rates = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--rates must be a JSON object of capability to rate: {exc}") from exc
    if not isinstance(rates, dict):
        raise ConfigError("--rates must be a JSON object of capability to rate")
    return check_rates(rates)
