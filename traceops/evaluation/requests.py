"""Held-out real requests, replayed: every model answers the same logged requests training never saw,
and each domain's grader scores the replies against their references.

The requests come from ``traceops.heldout`` (the seeded per-task split of the curated logs, references
from the logs' successes and the user's reference file). Per domain at most ``limit`` requests with a
reference are replayed, in the split's seeded hash order; the rest are counted with the reason (no
reference, no user turn, over the limit), never silently dropped. Each request is generated with its
own tools (requests with different tools share a batch: ``request_batches``) and room for its longest
reference (``traceops.evaluation.room``), the raw output read as a reply (``graders.reply_from_text``) and
scored by ``graders.grade`` against every reference: the best score counts, and a grader failure is
recorded as a problem, not scored 0. A request succeeds when its score is the full score (1.0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from traceops.evaluation.intervals import RESAMPLES, paired_bootstrap, task_differences, wilson, wilson_rate
from traceops.evaluation.metrics import is_success
from traceops.evaluation.room import room_for
from traceops.graders import Grader, grade, load_grader, reply_from_text
from traceops.hashing import content_hash
from traceops.heldout import (
    LoggedRequest,
    RequestParams,
    heldout_score,
    is_heldout,
    load_references,
    logged_requests,
)
from traceops.model.base import ChatModel, GenerationConfig, tools_of_batch
from traceops.model.toolcalls import chat_assistant_text, messages_to_chat, tools_to_openai
from traceops.schema import Trajectory

OVER_LIMIT = "over the limit: evaluate.requests.limit requests with a reference are replayed per domain"


@dataclass(frozen=True)
class RequestSet:
    """The held-out requests to replay (``requests``, by domain, then seeded) and those not
    replayed, ``skipped``: ``"<domain>/<task_id>"`` -> reason."""

    requests: list[LoggedRequest] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def domains(self) -> list[str]:
        return sorted({r.domain for r in self.requests})

    def skipped_by_reason(self) -> dict[str, int]:
        """How many requests were not replayed, by reason (a reason's last clause, without the file
        and record it names, so the same reason groups)."""
        out: dict[str, int] = {}
        for reason in self.skipped.values():
            key = reason.rsplit(": ", 1)[-1]
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))


def select_requests(trajectories: Iterable[Trajectory], params: RequestParams) -> RequestSet:
    """The held-out requests of every domain in ``trajectories`` under ``params`` (split, references
    from the logs and ``params.references``, at most ``params.limit`` with a reference per domain).
    Streams: only the held-out trajectories are kept."""
    held = [t for t in trajectories if is_heldout(t.task_id, params.seed, params.heldout_fraction)]
    references = load_references(params.references) if params.references else None
    chosen: list[LoggedRequest] = []
    skipped: dict[str, str] = {}
    taken: dict[str, int] = {}
    # Within a domain in the split's own hash order: a seeded sample, not the first ids alphabetically
    # (ids often start with their category, and a limit would then take whole categories only).
    order = sorted(logged_requests(held, references),
                   key=lambda r: (r.domain, heldout_score(r.task_id, params.seed), r.task_id))
    for request in order:
        key = f"{request.domain}/{request.task_id}"
        if request.skip is not None:
            skipped[key] = request.skip
        elif params.limit is not None and taken.get(request.domain, 0) >= params.limit:
            skipped[key] = OVER_LIMIT
        else:
            taken[request.domain] = taken.get(request.domain, 0) + 1
            chosen.append(request)
    return RequestSet(chosen, skipped)


def load_graders(domains: Sequence[str], params: RequestParams) -> dict[str, Grader]:
    """Each domain's grader (``params.grader_spec``), loaded once before any model runs so a wrong
    spec fails first; domains naming the same spec share one grader."""
    loaded: dict[str, Grader] = {}
    out: dict[str, Grader] = {}
    for domain in domains:
        spec = params.grader_spec(domain)
        if spec not in loaded:
            loaded[spec] = load_grader(spec)
        out[domain] = loaded[spec]
    return out


@dataclass(frozen=True)
class RequestScore:
    """One model's reply to one held-out request: the best score over the references (None when the
    grader failed on every one, then ``problem`` says why) and the raw output."""

    task_id: str
    domain: str
    score: float | None
    reply: str
    problem: str | None = None

    @property
    def success(self) -> bool:
        return self.score is not None and is_success(self.score)

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "domain": self.domain, "score": self.score, "reply": self.reply,
                "problem": self.problem, "success": self.success}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestScore:
        score = data.get("score")
        return cls(task_id=str(data["task_id"]), domain=str(data["domain"]),
                   score=None if score is None else float(score), reply=str(data.get("reply") or ""),
                   problem=data.get("problem"))


@dataclass(frozen=True)
class RequestEval:
    """A model's results on the held-out real requests: per request scores, the skipped count by
    reason, and the grader per domain. Rates are over graded requests (grader failures excluded)."""

    scores: list[RequestScore] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    graders: dict[str, str] = field(default_factory=dict)

    def _graded(self, domain: str | None = None) -> list[RequestScore]:
        return [s for s in self.scores if s.score is not None and (domain is None or s.domain == domain)]

    @property
    def domains(self) -> list[str]:
        return sorted({s.domain for s in self.scores})

    def graded(self, domain: str | None = None) -> int:
        """How many requests (of ``domain``, or all) the grader scored."""
        return len(self._graded(domain))

    @property
    def problems(self) -> list[str]:
        return [s.problem for s in self.scores if s.problem]

    def success(self, domain: str) -> float | None:
        graded = self._graded(domain)
        return sum(s.success for s in graded) / len(graded) if graded else None

    def success_ci(self, domain: str) -> tuple[float, float] | None:
        graded = self._graded(domain)
        return wilson(sum(s.success for s in graded), len(graded))

    @property
    def success_overall(self) -> float | None:
        """Macro success over the domains with a graded request (each domain weighs the same)."""
        rates = [r for r in (self.success(d) for d in self.domains) if r is not None]
        return sum(rates) / len(rates) if rates else None

    @property
    def success_overall_ci(self) -> tuple[float, float] | None:
        rate = self.success_overall
        return None if rate is None else wilson_rate(rate, len(self._graded()))

    def outcomes(self) -> dict[str, dict[str, list[float]]]:
        """Domain -> task id -> ``[1.0]`` or ``[0.0]``: what the paired bootstrap pairs on."""
        out: dict[str, dict[str, list[float]]] = {}
        for s in self._graded():
            out.setdefault(s.domain, {})[s.task_id] = [1.0 if s.success else 0.0]
        return out

    def summary(self) -> dict[str, Any]:
        """Flat numbers: ``requests.success`` (macro) with its interval, graded, grader problems and
        skipped counts, and per domain ``requests.success.<domain>`` with its interval and count."""
        ci = self.success_overall_ci
        out: dict[str, Any] = {"requests.success": self.success_overall,
                               "requests.success.low": ci[0] if ci else None,
                               "requests.success.high": ci[1] if ci else None,
                               "requests.graded": len(self._graded()),
                               "requests.grader_problems": len(self.problems),
                               "requests.skipped": sum(self.skipped.values())}
        for domain in self.domains:
            dci = self.success_ci(domain)
            out[f"requests.success.{domain}"] = self.success(domain)
            out[f"requests.success.{domain}.low"] = dci[0] if dci else None
            out[f"requests.success.{domain}.high"] = dci[1] if dci else None
            out[f"requests.graded.{domain}"] = len(self._graded(domain))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"scores": [s.to_dict() for s in self.scores], "skipped": dict(self.skipped),
                "graders": dict(self.graders)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestEval:
        return cls(scores=[RequestScore.from_dict(s) for s in data.get("scores") or []],
                   skipped={str(k): int(v) for k, v in (data.get("skipped") or {}).items()},
                   graders={str(k): str(v) for k, v in (data.get("graders") or {}).items()})


def evaluate_requests(
    model: ChatModel,
    selected: RequestSet,
    graders: Mapping[str, Grader],
    config: GenerationConfig,
    batch_size: int = 8,
    grader_specs: Mapping[str, str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RequestEval:
    """Replay ``selected.requests`` through ``model`` (``request_batches``: each request with its own
    tools) and grade every reply with its domain's grader (``graders``)."""
    texts = request_replies(model, selected, config, batch_size, progress)
    return grade_replies(selected, texts, graders, grader_specs)


def replies_identity(selected: RequestSet) -> str:
    """The content hash of what the replies to ``selected`` depend on (each request's conversation and
    tools, in order, and the references' text its room is sized by): the evaluation cache's key for them."""
    rows = [[r.domain, r.task_id, messages_to_chat(r.messages), [t.model_dump(mode="json") for t in r.tools],
             reference_texts(r)] for r in selected.requests]
    return content_hash(rows, length=32)


def reference_texts(request: LoggedRequest) -> list[str]:
    """Each reference reply of ``request`` as the model would write it (content, then canonical calls)."""
    return [chat_assistant_text(message) for message in messages_to_chat(request.references)]


def reply_room(model: ChatModel, requests: Sequence[LoggedRequest], floor: int) -> int:
    """New tokens a batch of ``requests`` may generate: ``floor`` (the per-turn cap), or room for the
    longest reference (``traceops.evaluation.room``)."""
    return room_for(model, [text for request in requests for text in reference_texts(request)], floor)


def request_replies(
    model: ChatModel,
    selected: RequestSet,
    config: GenerationConfig,
    batch_size: int = 8,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, str]:
    """The raw output of ``model`` for every request of ``selected``, by ``"<domain>/<task_id>"``, in
    the batches ``request_batches`` forms: each request with its own tools, each batch with room for its
    longest reference (``config.max_new_tokens`` at least)."""
    texts: dict[str, str] = {}
    done = 0
    for batch, room in request_batches(model, selected.requests, config.max_new_tokens, batch_size):
        chats = [messages_to_chat(r.messages) for r in batch]
        tools = tools_of_batch([tools_to_openai(r.tools) or None for r in batch])
        outputs = model.generate(chats, tools=tools, config=replace(config, max_new_tokens=room))
        for request, text in zip(batch, outputs, strict=True):
            texts[f"{request.domain}/{request.task_id}"] = text
        done += len(batch)
        if progress is not None:
            progress(done, len(selected.requests))
    return texts


def request_batches(model: ChatModel, requests: Sequence[LoggedRequest], floor: int,
                    batch_size: int) -> list[tuple[list[LoggedRequest], int]]:
    """``requests`` in batches of at most ``batch_size``, each with the new tokens it may generate
    (``reply_room``: ``floor`` or room for its longest reference).

    Requests that offer different tools share a batch (a ``ToolsEach``): logs whose requests each bring
    their own tools (BFCL's) were otherwise generated one by one. A batch holds one domain's requests
    (domains' prompts differ in length by thousands of tokens, and padding would cost more than it
    saves), ordered by room, so the rows that may run long decode together, then by tool list, so
    requests with equal tools keep their shared system + tools prefix in one batch.
    """
    keyed = []
    for index, request in enumerate(requests):
        tools_key = content_hash([t.model_dump(mode="json") for t in request.tools])
        keyed.append(((request.domain, reply_room(model, [request], floor), tools_key, index), request))
    keyed.sort(key=lambda item: item[0])
    batches: list[tuple[list[LoggedRequest], int]] = []
    for (domain, room, _tools, _index), request in keyed:
        last = batches[-1] if batches else None
        if last is None or len(last[0]) >= batch_size or last[0][0].domain != domain:
            batches.append(([request], room))
        else:
            last[0].append(request)
            batches[-1] = (last[0], max(last[1], room))
    return batches


def grade_replies(selected: RequestSet, texts: Mapping[str, str], graders: Mapping[str, Grader],
                  grader_specs: Mapping[str, str] | None = None) -> RequestEval:
    """Grade each request's reply (``texts``, as ``request_replies`` gives them) with its domain's grader."""
    scores = [score_reply(r, texts[f"{r.domain}/{r.task_id}"], graders[r.domain]) for r in selected.requests]
    return RequestEval(scores=scores, skipped=selected.skipped_by_reason(),
                       graders=dict(grader_specs or {}))


def score_reply(request: LoggedRequest, text: str, grader: Grader) -> RequestScore:
    """The best grade of ``text`` (a model's raw output) over the request's references; a grader
    failure on every reference is the score None with the problems joined."""
    reply = reply_from_text(text)
    best: float | None = None
    problems: list[str] = []
    for index, reference in enumerate(request.references):
        where = f"{request.where} ({request.domain}/{request.task_id}), reference {index}"
        result = grade(grader, request.messages, request.tools, reply, reference, where=where)
        if result.ok:
            best = result.score if best is None else max(best, result.score)
        else:
            problems.append(str(result.problem))
    return RequestScore(task_id=request.task_id, domain=request.domain, score=best, reply=text,
                        problem=None if best is not None else "; ".join(problems) or "no reference")


def compare_requests(candidate: RequestEval | None, reference: RequestEval | None,
                     resamples: int = RESAMPLES, seed: int = 0) -> dict[str, Any] | None:
    """The paired comparison of two models on the held-out requests both were graded on, in
    ``regression()``'s shape (``overall`` and ``capabilities`` keyed by domain, each with ``candidate``,
    ``champion`` (the reference's rate), ``delta``, ``low``, ``high``, ``tasks``); the overall interval
    is the paired bootstrap stratified by domain. None when either side has no request evaluation."""
    if candidate is None or reference is None:
        return None
    mine, theirs = candidate.outcomes(), reference.outcomes()
    rows: dict[str, dict[str, Any]] = {}
    differences: dict[str, list[float]] = {}
    for domain in sorted(set(mine) & set(theirs)):
        shared = sorted(set(mine[domain]) & set(theirs[domain]))
        differences[domain] = task_differences(mine[domain], theirs[domain])
        rate_mine = sum(mine[domain][t][0] for t in shared) / len(shared) if shared else None
        rate_theirs = sum(theirs[domain][t][0] for t in shared) / len(shared) if shared else None
        bounds = paired_bootstrap({domain: differences[domain]}, resamples, seed)
        rows[domain] = {"candidate": rate_mine, "champion": rate_theirs,
                        "delta": bounds[0] if bounds else None, "low": bounds[1] if bounds else None,
                        "high": bounds[2] if bounds else None, "tasks": len(shared)}
    bounds = paired_bootstrap(differences, resamples, seed)
    overall = None
    if bounds is not None:
        used = [r for r in rows.values() if r["tasks"]]
        overall = {"candidate": sum(r["candidate"] for r in used) / len(used),
                   "champion": sum(r["champion"] for r in used) / len(used),
                   "delta": bounds[0], "low": bounds[1], "high": bounds[2],
                   "tasks": sum(r["tasks"] for r in rows.values())}
    return {"overall": overall, "capabilities": rows, "shared": sorted(rows),
            "interval": {"method": "paired bootstrap over held-out requests, stratified by domain",
                         "resamples": resamples, "seed": seed}}
