"""The synthesize stage as a pure function: capabilities + trajectories -> environment task files.

For each capability: pick the seed trajectories (its failures, nearest the failure cluster first), build
the grounding, generate train/val/test task specs, check disjointness from evaluation data, self-test
the verifier, optionally calibrate a model, and write

    <out_dir>/<capability>/{train,val,test}.jsonl   one canonical-JSON task spec per line, by task_id
    <out_dir>/<capability>/manifest.json            family, parameters, seed, counts, self_tests,
                                                    calibration, grounding, skipped items
    <out_dir>/synthesis.json                        what was written and what was skipped, and why

Nothing time- or machine-dependent is written, so the same inputs give byte-identical files.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from traceops.atomic import atomic_write_text
from traceops.envs.calibration import Calibration, Episodes, calibrate
from traceops.envs.families import FAMILIES
from traceops.envs.family import Family, task_id
from traceops.envs.folder import MANIFEST_NAME, read_task_specs
from traceops.envs.grounding import INTERFACES, Grounding, assert_disjoint, build_grounding, select_seeds
from traceops.envs.native import is_native
from traceops.envs.rewrite import RewriteStats, rewrite_requests, shown_writer
from traceops.envs.selftest import THRESHOLD, self_test
from traceops.errors import ConfigError
from traceops.hashing import canonical_json, file_hash, folder_hash
from traceops.schema import Trajectory

SPLITS = ("train", "val", "test")
# Rounds of fresh instances that replace repeated tasks before a split is left short.
TOP_UP_ROUNDS = 4
STRUCTURED_FIELDS = ("tables", "gold", "records", "lookups")


@dataclass(frozen=True)
class SynthesisParams:
    """Parameters of the stage (``params.yaml`` section ``synthesize``)."""

    train_size: int = 200
    val_size: int = 50
    test_size: int = 50
    levels: tuple[int, ...] | None = None
    seeds_per_capability: int = 32
    self_test_size: int | None = None
    threshold: float = THRESHOLD
    calibration_per_level: int = 8
    llm: str | None = None  # an OpenAI-compatible writer (URL#model) that rewrites requests; None: offline
    # How call-API families present logged tools: None (native: the agent's own tools and prompt) or
    # "catalog" (one call_api tool and a catalog in the instruction, the interface before issue 28).
    interface: str | None = None

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> SynthesisParams:
        """Validate a mapping (unknown keys and negative sizes are configuration errors)."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"params.yaml synthesize: unknown key(s) {unknown}; known: {sorted(known)}")
        if values.get("levels") is not None:
            values["levels"] = tuple(int(v) for v in values["levels"])
        params = cls(**values)
        for name in ("train_size", "val_size", "test_size", "seeds_per_capability", "calibration_per_level"):
            if int(getattr(params, name)) < 0:
                raise ConfigError(f"params.yaml synthesize.{name} is {getattr(params, name)}; use 0 or more")
        if params.interface not in (None, *INTERFACES):
            raise ConfigError(f"params.yaml synthesize.interface is {params.interface!r}; use one of "
                              f"{list(INTERFACES)} or null (native)")
        if not 0.0 < params.threshold <= 1.0:
            raise ConfigError("params.yaml synthesize.threshold must be in (0, 1]")
        return params

    def sizes(self) -> dict[str, int]:
        """Requested size of each split."""
        return {"train": self.train_size, "val": self.val_size, "test": self.test_size}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the manifest."""
        out = asdict(self)
        out["levels"] = list(self.levels) if self.levels is not None else None
        if self.llm:  # a URL may carry credentials (user:key@host): never written
            out["llm"] = shown_writer(self.llm)
        return out


@dataclass
class SynthesisResult:
    """What the stage wrote: per-capability manifests, skipped items, files and the folder hash."""

    out_dir: Path
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    env_hash: str = ""

    @property
    def passed(self) -> bool:
        """True when every written capability passed its self-tests."""
        return all(m["self_tests"]["passed"] for m in self.manifests.values())

    @property
    def failed(self) -> list[str]:
        """Capabilities whose self-tests failed (their files are written but must not be trained on)."""
        return sorted(c for c, m in self.manifests.items() if not m["self_tests"]["passed"])

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (for the CLI's ``--json`` and the orchestration layer)."""
        return {
            "out_dir": str(self.out_dir),
            "capabilities": sorted(self.manifests),
            "skipped": self.skipped,
            "passed": self.passed,
            "failed": self.failed,
            "env_hash": self.env_hash,
            "files": [str(p) for p in self.files],
            "counts": {c: m["counts"] for c, m in sorted(self.manifests.items())},
        }


def _write(path: Path, text: str) -> Path:
    return atomic_write_text(path, text)


def _jsonl(tasks: Sequence[dict[str, Any]]) -> str:
    lines = [canonical_json(t) for t in sorted(tasks, key=lambda t: t["task_id"])]
    return "".join(f"{line}\n" for line in lines)


def content_key(task: Mapping[str, Any]) -> str:
    """What a task asks and what is right, without its level: two tasks with the same key are one task
    to a model (a replayed logged request without values comes out the same at every level)."""
    return task_id({k: v for k, v in task.items() if k != "level"})


def drop_repeats(tasks: Sequence[dict[str, Any]], seen: set[str]) -> list[dict[str, Any]]:
    """``tasks`` without those whose ``content_key`` is in ``seen`` or came earlier; ``seen`` grows."""
    unique = []
    for task in tasks:
        key = content_key(task)
        if key not in seen:
            seen.add(key)
            unique.append(task)
    return unique


def distinct_splits(family: Family, grounding: Grounding, seed: int, sizes: Mapping[str, int],
                    levels: Sequence[int] | None, exclude: Sequence[str], notes: list[str]
                    ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """The splits at their sizes, no task repeated within or across them (a repeat in train is a wasted
    step, one in test is scored on a task training saw): repeats are dropped and replaced by instances
    past every split's range (instance ``i`` still depends only on (seed, i)), up to ``TOP_UP_ROUNDS``
    rounds; a split still short is noted. Also the first-drawn tasks in generation order (self-test)."""
    splits: dict[str, list[dict[str, Any]]] = {}
    generated: list[dict[str, Any]] = []
    seen: set[str] = set()
    offset = 0
    extra = sum(sizes.values())  # top-up instances start past every split's own range
    for split in SPLITS:
        drawn = family.generate(grounding, seed, sizes[split], levels=levels, exclude=exclude, offset=offset)
        offset += sizes[split]
        generated.extend(drawn)
        unique = drop_repeats(drawn, seen)
        dropped = len(drawn) - len(unique)
        for _ in range(TOP_UP_ROUNDS):
            missing = sizes[split] - len(unique)
            if missing <= 0:
                break
            more = family.generate(grounding, seed, missing, levels=levels, exclude=exclude, offset=extra)
            extra += missing
            unique.extend(drop_repeats(more, seen))
        if dropped:
            short = sizes[split] - len(unique)
            notes.append(f"split '{split}': {dropped} repeated task(s) replaced by fresh ones"
                         + (f"; {short} short: the logs give no more distinct tasks" if short > 0 else ""))
        splits[split] = unique
    return splits, generated


def synthesize_one(
    family: Family,
    trajectories: Sequence[Trajectory],
    params: SynthesisParams,
    seed: int,
    *,
    exclude: Sequence[str] = (),
    embeddings: Mapping[str, Sequence[float]] | None = None,
    centroid: Sequence[float] | None = None,
    episodes: Callable[[Family], Episodes] | None = None,
    writer: Any = None,
    phrasing: Sequence[Trajectory] | None = None,
) -> tuple[dict[str, list], dict[str, Any]]:
    """Task splits and the manifest (without file hashes) for one family; ``writer`` (a ChatModel)
    rewrites native requests in prose, each rewrite kept only when checked (``rewrite``); ``phrasing``
    (default ``trajectories``): the runs whose requests and first replies are mined (see ``synthesize``)."""
    capability = family.capability
    notes: list[str] = []
    seeds = select_seeds(
        trajectories, capability, params.seeds_per_capability, embeddings=embeddings, centroid=centroid
    )
    if seeds:
        basis = seeds
    else:
        basis = list(trajectories)
        notes.append(
            f"no failed trajectory is labelled '{capability}': grounded on all {len(basis)} "
            f"trajectories instead"
        )
    # Phrasing and reply shapes come from every logged request, the tools and values from the seeds.
    grounding = build_grounding(basis, seed_ids=[t.id for t in seeds], exclude=exclude,
                                phrasing_from=trajectories if phrasing is None else phrasing,
                                interface=params.interface)
    if grounding.source == "default":
        notes.append(
            "the logs carry no tools (no schemas, no observed calls): the family uses its built-in "
            "default tools and entities"
        )
    elif grounding.source == "inferred":
        notes.append(
            "some tools had no schema in the logs: their arguments were inferred from observed calls"
        )
    for tool in grounding.tools:
        if tool.get("schema_problem") and grounding.interface == "native":
            notes.append(f"tool '{tool['name']}' is not offered: {tool['schema_problem']}")
    sizes = params.sizes()
    for split in SPLITS:
        if sizes[split] == 0:
            notes.append(f"split '{split}' requested with size 0: written empty")
    splits, generated = distinct_splits(family, grounding, seed, sizes, params.levels, exclude, notes)
    if writer is not None:  # the self-test runs on the offline tasks: a rewrite changes only the request
        rewrites = RewriteStats(writer=shown_writer(params.llm) if params.llm else writer.info.model_id)
        seen: set[str] = set()
        for split in SPLITS:
            written = [t if "written_by" not in t else {**t, "task_id": task_id(t)}
                       for t in rewrite_requests(splits[split], writer, rewrites)]
            splits[split] = drop_repeats(written, seen)
            if len(splits[split]) != len(written):
                notes.append(f"split '{split}': dropped {len(written) - len(splits[split])} rewritten "
                             "task(s) that repeat another")
    else:
        rewrites = None
    everything = [t for split in SPLITS for t in splits[split]]
    assert_disjoint(everything, set(exclude) | set(grounding.observed_values), fields=STRUCTURED_FIELDS)
    sample = generated[: params.self_test_size] if params.self_test_size is not None else generated
    regenerated = family.generate(
        grounding, seed, min(20, sizes["train"]), levels=params.levels, exclude=exclude
    )
    tests = self_test(family, sample, seed=seed, regenerated=regenerated, threshold=params.threshold)
    if episodes is None:
        calibration: dict[str, Any] = {"status": "absent", "reason": "no model was given to calibrate"}
    elif not splits["val"]:
        calibration = {"status": "absent", "reason": "the val split is empty"}
    else:
        result: Calibration = calibrate(
            splits["val"], episodes(family), per_level=params.calibration_per_level
        )
        calibration = {"status": "measured", **result.to_dict()}
    by_level: dict[str, dict[str, int]] = {}
    for split in SPLITS:
        for task in splits[split]:
            by_level.setdefault(str(task["level"]), {s: 0 for s in SPLITS})[split] += 1
    env = family.make_env()
    manifest = {
        "capability": capability,
        "family": type(family).__name__,
        "description": family.description,
        "levels": list(params.levels or family.levels),
        "parameters": params.to_dict(),
        "seed": seed,
        "counts": {**{s: len(splits[s]) for s in SPLITS}, "by_level": dict(sorted(by_level.items()))},
        # native tasks bring their own tools (the logged ones); the class's tools serve the others
        "tools": sorted({s["function"]["name"] for t in everything for s in t.get("tools", [])})
        if any(is_native(t) for t in everything) else env.tool_names(),
        "self_tests": tests,
        "calibration": calibration,
        "grounding": {
            "source": grounding.source,
            "interface": grounding.interface,
            "request_templates": sum(len(v) for v in grounding.templates.values()),
            "max_parallel_calls": grounding.max_parallel,
            "no_call_replies": grounding.no_call_replies,
            "hash": grounding.hash,
            "domain": grounding.domain,
            "tools": [t["name"] for t in grounding.tools],
            "entities": sorted(grounding.entities),
            "seed_trajectories": list(grounding.seed_ids),
            "excluded_values": len(set(exclude)),
        },
        "notes": notes,
    }
    if rewrites is not None:
        manifest["rewrites"] = rewrites.to_dict()
    return splits, manifest


def synthesize(
    capabilities: Sequence[str],
    trajectories: Sequence[Trajectory],
    out_dir: str | Path,
    params: SynthesisParams | Mapping[str, Any] | None = None,
    seed: int = 0,
    *,
    exclude: Sequence[str] = (),
    embeddings: Mapping[str, Sequence[float]] | None = None,
    centroids: Mapping[str, Sequence[float]] | None = None,
    episodes: Callable[[Family], Episodes] | None = None,
    writer: Any = None,
    phrasing: Sequence[Trajectory] | None = None,
) -> SynthesisResult:
    """Write environments for ``capabilities`` under ``out_dir`` and return what was written and skipped.

    ``exclude``: values from evaluation data that generated entities must never reuse. ``embeddings``
    (trajectory id -> vector) and ``centroids`` (capability -> vector) rank seed trajectories; without
    them TF-IDF is used. ``episodes(family)`` returns an episodes callable for calibration (absent: the
    manifest says calibration was not measured). ``writer`` (a ChatModel; default: the model
    ``params.llm`` names, loaded once, else none) rewrites native requests (``traceops.envs.rewrite``).
    ``phrasing`` (default ``trajectories``): the runs whose requests, first replies and system prompts
    are mined, e.g. ``trajectories`` with failed runs answered by a user's reference replies
    (``traceops.reference_replies``); the seeds, tools and values still come from ``trajectories``.
    """
    if not isinstance(params, SynthesisParams):
        params = SynthesisParams.from_dict(params)
    if writer is None and params.llm:
        from traceops.model import load_model

        writer = load_model(params.llm)
    root = Path(out_dir)
    result = SynthesisResult(out_dir=root)
    for capability in sorted(dict.fromkeys(capabilities)):
        family = FAMILIES.get(capability)
        if family is None:
            result.skipped.append(
                {
                    "capability": capability,
                    "reason": (
                        f"no environment family covers '{capability}' "
                        f"(families: {', '.join(sorted(FAMILIES))}); reported as an uncovered gap"
                    ),
                }
            )
            continue
        if sum(params.sizes().values()) == 0:
            result.skipped.append(
                {
                    "capability": capability,
                    "reason": (
                        "requested size is zero for every split (train_size, val_size, test_size): "
                        "nothing to write"
                    ),
                }
            )
            continue
        splits, manifest = synthesize_one(
            family,
            trajectories,
            params,
            seed,
            exclude=exclude,
            embeddings=embeddings,
            centroid=(centroids or {}).get(capability),
            episodes=episodes,
            writer=writer,
            phrasing=phrasing,
        )
        folder = root / capability
        hashes = {}
        for split in SPLITS:
            path = _write(folder / f"{split}.jsonl", _jsonl(splits[split]))
            result.files.append(path)
            hashes[split] = file_hash(path)
        manifest["files"] = hashes
        result.files.append(
            _write(folder / MANIFEST_NAME, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        )
        result.manifests[capability] = manifest
    summary = {
        "capabilities": sorted(result.manifests),
        "skipped": result.skipped,
        "seed": seed,
        "parameters": params.to_dict(),
        "passed": result.passed,
        "failed": result.failed,
    }
    result.files.append(_write(root / "synthesis.json", json.dumps(summary, indent=2, sort_keys=True) + "\n"))
    result.env_hash = folder_hash(root)
    return result


def load_split(out_dir: str | Path, capability: str, split: str) -> list[dict[str, Any]]:
    """Read the task specs of one split written by ``synthesize``."""
    path = Path(out_dir) / capability / f"{split}.jsonl"
    if not path.exists():
        raise ConfigError(f"{path} does not exist; run the synthesize stage for '{capability}' first")
    return [task for _, task in read_task_specs(path)]
