"""Production logs for the BFCL domain: a real agent's replies to the bundled requests, and their outcomes.

Runs a model (default: the embedded one, ``traceops.model.load_model("embedded")``) on every request of
``requests.jsonl`` with the request's own tools, prompted the way ``traceops serve`` prompts one chat
request (``ChatModel.complete`` with the request's messages and tools; greedy, seed 0, so the run is
reproducible), and writes

* ``logs/embedded.jsonl``: one OpenAI chat-completions call log per request, ``{"task_id", "domain":
  "bfcl", "metadata": {"category"}, "request": {"model", "messages", "tools"}, "response": {"id",
  "choices": [{"message"}], ...}}`` (the body ``traceops serve`` returns, tool calls parsed the same
  way); response and call ids are derived from the request and the reply, not the clock, so a rerun
  writes the same file;
* ``outcomes.jsonl``: ``{"task_id", "success", "reward"}`` per request, from the checker: the reply
  scored by ``tool_call_match`` against each of the task's reference replies (``references.jsonl``),
  best score = reward, success when it is 1.

    .venv/bin/python data/public/bfcl/generate_logs.py [--per-category 4] [--max-new-tokens 128]

The defaults are the bundled run's (every development request: 200; see SOURCE.md for its time);
``--per-category N`` runs only the first N requests of each category. Each finished batch is appended
to ``<logs>.partial``, so a run that stops resumes where it was (the two files are written, and the side
file removed, at the end).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from traceops.formats.common import tool_spec
from traceops.graders import grade, reply_from_text, tool_call_match
from traceops.hashing import content_hash
from traceops.heldout import load_references
from traceops.model import ChatModel, GenerationConfig, load_model
from traceops.model.base import Completion
from traceops.model.toolcalls import render_prompt, tool_system_block, tools_to_openai
from traceops.schema import Message, ToolSpec
from traceops.serve import completion_response

HERE = Path(__file__).resolve().parent
DOMAIN = "bfcl"


def read_requests(path: Path) -> list[dict[str, Any]]:
    """The bundled requests, in file order."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def tool_specs(tools: list[dict[str, Any]], task_id: str) -> list[ToolSpec]:
    """A request's OpenAI tools as schema ToolSpecs (what the grader reads)."""
    return [ToolSpec.model_validate(tool_spec(tool, f"{task_id}.tools[{i}]")) for i, tool in enumerate(tools)]


def stable_response(response: dict[str, Any], task_id: str, text: str) -> dict[str, Any]:
    """``response`` with its clock-derived ids and time replaced by ones derived from the request and
    reply (``traceops serve`` stamps them with the time; a bundled log must be reproducible)."""
    response_id = "chatcmpl-" + content_hash({"task_id": task_id, "text": text})
    response["id"] = response_id
    response["created"] = 0
    for index, call in enumerate(response["choices"][0]["message"].get("tool_calls") or []):
        call["id"] = f"call_{content_hash([response_id, index], length=12)}"
    return response


def batchable(model: ChatModel, request: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request as a tool-less chat whose prompt is exactly the served prompt of the request with
    its tools (the tools' system block in front), so requests with different tools share a batch; None
    when the model's template renders tools itself (then the request is generated on its own)."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None or any(m.get("role") == "system" for m in request["messages"]):
        return None
    chat = [{"role": "system", "content": tool_system_block(tools_to_openai(request["tools"]))},
            *request["messages"]]
    served = render_prompt(tokenizer, request["messages"], request["tools"])
    return chat if render_prompt(tokenizer, chat, None) == served else None


def completions(model: ChatModel, requests: list[dict[str, Any]], config: GenerationConfig,
                batch_size: int) -> list[Completion]:
    """One completion per request, prompted as ``traceops serve`` prompts it; batched where the
    prompts allow (``batchable``), in file order so a rerun gives the same batches."""
    out: list[Completion | None] = [None] * len(requests)
    chats = [batchable(model, request) for request in requests]
    shared = [i for i, chat in enumerate(chats) if chat is not None]
    started = time.perf_counter()
    for start in range(0, len(shared), batch_size):
        indices = shared[start:start + batch_size]
        for i, completion in zip(indices, model.complete([chats[i] for i in indices], None, config),
                                 strict=True):
            out[i] = completion
        done = min(start + batch_size, len(shared))
        print(f"\r{done}/{len(requests)} {time.perf_counter() - started:.0f}s", end="", file=sys.stderr,
              flush=True)
    for i, request in enumerate(requests):
        if out[i] is None:
            out[i] = model.complete([request["messages"]], request["tools"], config)[0]
    print(file=sys.stderr)
    return [completion for completion in out if completion is not None]


def checked(reply: Message, request: dict[str, Any], tools: list[ToolSpec],
            references: list[Message]) -> float:
    """The best ``tool_call_match`` score of ``reply`` over the task's references; a grader problem
    stops the run (the bundled references are ours to fix)."""
    messages = [Message.model_validate(m) for m in request["messages"]]
    best = 0.0
    for index, reference in enumerate(references):
        result = grade(tool_call_match, messages, tools, reply, reference,
                       where=f"references.jsonl task {request['task_id']} alternative {index}")
        if not result.ok:
            raise SystemExit(result.problem)
        best = max(best, result.score or 0.0)
    return best


def row_for(request: dict[str, Any], completion: Completion, model_id: str,
            references: list[Message]) -> dict[str, Any]:
    """One request's call log (the body ``traceops serve`` returns) and its checked outcome."""
    task_id = request["task_id"]
    response = stable_response(completion_response(completion, model_id), task_id, completion.text)
    tools = tool_specs(request["tools"], task_id)
    score = checked(reply_from_text(completion.text), request, tools, references)
    log = {"task_id": task_id, "domain": DOMAIN, "metadata": {"category": request["category"]},
           "request": {"model": model_id, "messages": request["messages"], "tools": request["tools"]},
           "response": response}
    return {"log": log, "outcome": {"task_id": task_id, "success": score == 1.0, "reward": score}}


def main() -> None:
    """Generate, check, write the logs and outcomes, print a summary and one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=Path, default=HERE / "requests.jsonl")
    parser.add_argument("--references", type=Path, default=HERE / "references.jsonl")
    parser.add_argument("--logs", type=Path, default=HERE / "logs" / "embedded.jsonl")
    parser.add_argument("--outcomes", type=Path, default=HERE / "outcomes.jsonl")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--per-category", type=int, default=0,
                        help="only the first N requests of each category, in file order (0: all)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N requests")
    args = parser.parse_args()

    requests = read_requests(args.requests)
    if args.per_category:
        seen: dict[str, int] = {}
        kept = []
        for request in requests:
            seen[request["category"]] = seen.get(request["category"], 0) + 1
            if seen[request["category"]] <= args.per_category:
                kept.append(request)
        requests = kept
    requests = requests[:args.limit]
    references = load_references(args.references)
    model = load_model(args.model)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0, seed=0)
    logs, outcomes, per_category = [], [], {}
    missing = [r["task_id"] for r in requests if r["task_id"] not in references]
    if missing:
        raise SystemExit(f"{args.references}: no reference for tasks {missing[:5]}; rerun build.py")
    started = time.perf_counter()
    # Finished requests are kept in a side file as they complete, so a long run that stops resumes.
    partial = args.logs.with_name(args.logs.name + ".partial")
    done = {row["log"]["task_id"]: row for row in read_requests(partial)} if partial.is_file() else {}
    todo = [r for r in requests if r["task_id"] not in done]
    if done:
        print(f"resuming: {len(requests) - len(todo)} of {len(requests)} requests done in {partial}",
              file=sys.stderr)
    partial.parent.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(todo), args.batch_size):
        chunk = todo[start:start + args.batch_size]
        rows = [row_for(request, completion, model.info.model_id, references[request["task_id"]])
                for request, completion in zip(chunk, completions(model, chunk, config, args.batch_size),
                                               strict=True)]
        with partial.open("a", encoding="utf-8") as handle:
            handle.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        done.update((row["log"]["task_id"], row) for row in rows)
        print(f"{len(requests) - len(todo) + start + len(chunk)}/{len(requests)} requests", file=sys.stderr)
    for request in requests:
        row = done[request["task_id"]]
        logs.append(row["log"])
        outcomes.append(row["outcome"])
        tally = per_category.setdefault(request["category"], [0, 0])
        tally[0] += row["outcome"]["success"]
        tally[1] += 1
    seconds = time.perf_counter() - started
    for path, rows in ((args.logs, logs), (args.outcomes, outcomes)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    partial.unlink()
    for category, (passed, total) in sorted(per_category.items()):
        print(f"{category:15s} {passed:3d} / {total:3d} right")
    print(json.dumps({"model": model.info.model_id, "requests": len(requests), "seconds": round(seconds, 1),
                      "right": {c: t[0] for c, t in sorted(per_category.items())}}))


if __name__ == "__main__":
    main()
