"""Regenerate the bundled BFCL domain (requests, tool schemas, references) from the BFCL data files.

Source: the Berkeley Function Calling Leaderboard, https://github.com/ShishirPatil/gorilla
(berkeley-function-call-leaderboard/bfcl_eval/data, Apache-2.0). See SOURCE.md for the commit and what
each file holds. Stdlib plus jsonschema (a traceops dependency); deterministic: the same input files
give byte-identical output. Run it with the project's venv:

    .venv/bin/python data/public/bfcl/build.py --source DIR   # DIR holds BFCL_v4_<category>.json
                                                              # and possible_answer/BFCL_v4_<category>.json
    .venv/bin/python data/public/bfcl/build.py --git-dir GORILLA.git --commit SHA   # via `git show`

What it does:

* picks, per category (simple_python, multiple, parallel, irrelevance), the requests in the order of
  sha256(id): the first ``--per-category`` go to ``requests.jsonl`` (the development set the logs are
  made from), the next ``--final-per-category`` to ``final_check/requests.jsonl`` (kept unused for
  development, as the issue's final check), and the next ``--more-per-category`` to the development set
  again (so the development set grows while the final check keeps the same requests). Requests whose
  possible answer expands to more than
  ``--max-alternatives`` reference replies (or with none left valid) are passed over (counted in
  SOURCE.md's table).
* converts BFCL's function docs to OpenAI ``tools`` (``{"type": "function", "function": {...}}``) with
  JSON-Schema types: ``dict`` -> ``object``, ``float`` -> ``number``, ``tuple`` -> ``array``, ``any`` ->
  no ``type`` (any JSON value), BFCL's own ``optional`` flags dropped (``required`` already says it),
  and ``.`` in function names replaced by ``_`` (OpenAI names allow ``[a-zA-Z0-9_-]``; BFCL's own
  OpenAI handler does the same).
* drops reference alternatives whose arguments break the tool's own JSON schema (a few BFCL answers
  do); a request left with none is passed over.
* expands each possible answer (BFCL lists the allowed values of every argument; ``""`` means it may be
  left out) into reference replies, one per allowed combination, in the reference-file format
  ``{"task_id", "reply": assistant message}`` (several lines for one task are alternatives; a reply
  scores the best of them). An optional argument allowed as ``null`` (BFCL's "Default is None") counts
  as left out when its schema does not admit null. Leaving an optional argument out and giving it as
  its schema default are one alternative (tool_call_match treats them alike). Irrelevance requests get
  one reference that calls nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema  # a traceops dependency: run this with the project's venv

HERE = Path(__file__).resolve().parent
CATEGORIES = ("simple_python", "multiple", "parallel", "irrelevance")
DATA_PREFIX = "berkeley-function-call-leaderboard/bfcl_eval/data"
# BFCL's parameter types (GORILLA_TO_OPENAPI in bfcl_eval/constants/type_mappings.py) as JSON Schema;
# None: no type constraint ("any"). BFCL maps "any" to "string"; any JSON value is what it means.
TYPE_MAP: dict[str, str | None] = {
    "dict": "object", "object": "object", "float": "number", "double": "number", "number": "number",
    "integer": "integer", "int": "integer", "long": "integer", "string": "string", "str": "string",
    "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array", "tuple": "array",
    "any": None,
}
OMIT = object()  # an optional argument left out
NO_CALL_REPLY = "None of the available tools can do this, so I will not call one."


# ---------------------------------------------------------------------------------------------------
# Reading


def read_lines(text: str, name: str) -> list[dict[str, Any]]:
    """The JSON lines of one BFCL file."""
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{name}:{number}: not JSON ({exc.msg})") from None
    return rows


def load_category(category: str, source: Path | None, git_dir: Path | None, commit: str) -> tuple[list, dict]:
    """``(questions, {id: ground_truth})`` of one category, from a folder or a git directory."""
    names = [f"BFCL_v4_{category}.json", f"possible_answer/BFCL_v4_{category}.json"]
    texts = []
    for name in names:
        if source is not None:
            path = source / name
            texts.append(path.read_text(encoding="utf-8") if path.is_file() else "")
        else:
            out = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{DATA_PREFIX}/{name}"],
                                 capture_output=True, text=True, check=False)
            texts.append(out.stdout if out.returncode == 0 else "")
    if not texts[0]:
        raise SystemExit(f"no {names[0]} in the source; pass the folder holding BFCL's data files")
    answers = {row["id"]: row["ground_truth"] for row in read_lines(texts[1], names[1])}
    if category != "irrelevance" and not answers:
        raise SystemExit(f"no {names[1]} in the source; the possible answers are needed to check calls")
    return read_lines(texts[0], names[0]), answers


# ---------------------------------------------------------------------------------------------------
# Tool schemas


def openai_name(name: str) -> str:
    """A BFCL function name as an OpenAI function name (``.`` is not allowed there)."""
    return name.replace(".", "_")


def to_json_schema(schema: Any, where: str) -> Any:
    """A BFCL parameter schema as JSON Schema (see the module docstring); recursive."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "optional":
            continue  # BFCL's flag; "required" of the enclosing object already says it
        if key == "type":
            if value not in TYPE_MAP:
                raise SystemExit(f"{where}: unknown BFCL type {value!r}; add it to TYPE_MAP")
            if TYPE_MAP[value] is not None:
                out["type"] = TYPE_MAP[value]
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: to_json_schema(sub, f"{where}.{name}") for name, sub in value.items()}
        elif key == "items":
            out["items"] = to_json_schema(value, f"{where}[]")
        else:
            out[key] = value
    return out


def to_tools(functions: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """BFCL function docs as OpenAI ``tools``; two functions with one OpenAI name are an error."""
    tools = []
    seen = set()
    for function in functions:
        name = openai_name(function["name"])
        if name in seen:
            raise SystemExit(f"{where}: two functions are named {name!r} once '.' becomes '_'")
        seen.add(name)
        parameters = to_json_schema(function.get("parameters") or {"type": "dict", "properties": {}},
                                    f"{where}.{name}")
        parameters["type"] = "object"
        tools.append({"type": "function", "function": {
            "name": name, "description": function.get("description", ""), "parameters": parameters}})
    return tools


# ---------------------------------------------------------------------------------------------------
# Possible answers -> reference replies


def same(a: Any, b: Any) -> bool:
    """JSON equality with numbers by value and booleans apart from numbers (tool_call_match's rule)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def value_options(allowed: list[Any], schema: dict[str, Any] | None, optional: bool) -> list[Any]:
    """The distinct alternatives of one argument: OMIT and/or concrete values (nested dicts expanded)."""
    schema = schema if isinstance(schema, dict) else {}
    options: list[Any] = []
    # "" means "may be left out"; so does None for an optional argument whose schema has no null type
    # (BFCL writes it for "Default is None" arguments; null would break the schema).
    nullable = schema.get("type") in (None, "null")
    omit = optional and any(v == "" or (v is None and not nullable) for v in allowed)
    if omit:
        options.append(OMIT)
    for value in allowed:
        if optional and (value == "" or (value is None and not nullable)):
            continue
        expanded = (dict_options(value, schema) if isinstance(value, dict)
                    else list_options(value, schema) if isinstance(value, list) else [value])
        for choice in expanded:
            if omit and "default" in schema and same(choice, schema["default"]):
                continue  # giving the default is leaving it out
            if not any(o is not OMIT and same(o, choice) for o in options):
                options.append(choice)
    return options


def list_options(value: list[Any], schema: dict[str, Any]) -> list[list[Any]]:
    """A list value's alternatives: its object items hold allowed-value lists too (BFCL writes nested
    objects that way inside lists), so each object item is expanded; other items are kept as given."""
    if not any(isinstance(item, dict) for item in value):
        return [value]
    items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
    per_item = [dict_options(item, items) if isinstance(item, dict) else [item] for item in value]
    return [list(combo) for combo in itertools.product(*per_item)]


def dict_options(answer: dict[str, list[Any]], schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Every combination of one call's (or one nested object's) allowed argument values."""
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = set(schema.get("required") or [])
    keys = sorted(answer)
    per_key = []
    for key in keys:
        allowed = answer[key] if isinstance(answer[key], list) else [answer[key]]
        per_key.append(value_options(allowed, properties.get(key), key not in required))
    out = []
    for combo in itertools.product(*per_key):
        out.append({k: v for k, v in zip(keys, combo, strict=True) if v is not OMIT})
    return out


INVALID_DROPPED = [0]  # alternatives dropped for breaking their tool's schema, reported by main()


def schema_valid(arguments: dict[str, Any], schema: dict[str, Any]) -> bool:
    """Whether ``arguments`` meet the tool's JSON schema (a few BFCL answers do not, e.g. ``true`` for
    a string argument: such an alternative is dropped, not bundled as a right answer)."""
    return jsonschema.Draft202012Validator(schema).is_valid(arguments)


def reference_replies(ground_truth: list[dict[str, Any]], tools: list[dict[str, Any]],
                      limit: int) -> list | None:
    """The reference replies of one request (None when there would be more than ``limit``)."""
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    per_call = []
    for call in ground_truth:
        ((name, answer),) = call.items()
        name = openai_name(name)
        options = dict_options(answer, schemas.get(name, {}))
        valid = [(name, args) for args in options if schema_valid(args, schemas.get(name, {}))]
        INVALID_DROPPED[0] += len(options) - len(valid)
        per_call.append(valid)
    total = 1
    for options in per_call:
        total *= len(options)
    if total > limit or total == 0:
        return None
    replies = []
    for combo in itertools.product(*per_call):
        calls = [{"id": f"ref_{i}", "type": "function", "function": {
                      "name": name, "arguments": json.dumps(args, ensure_ascii=False, sort_keys=True)}}
                 for i, (name, args) in enumerate(combo)]
        replies.append({"role": "assistant", "content": None, "tool_calls": calls})
    return replies


# ---------------------------------------------------------------------------------------------------
# Selection and writing


def order_key(task_id: str) -> str:
    """The selection order: sha256 of the id, so the pick is spread over the file and stable."""
    return hashlib.sha256(task_id.encode()).hexdigest()


def build(categories: dict[str, tuple[list, dict]], per_category: int, final_per_category: int,
          limit: int, more_per_category: int = 0) -> tuple[dict[str, list], dict[str, dict[str, int]]]:
    """``({"dev": rows, "final": rows}, counts)``; a row is ``(request, [reference replies])``. In the
    selection order: ``per_category`` development requests, ``final_per_category`` final-check ones, then
    ``more_per_category`` development ones again."""
    sets: dict[str, list] = {"dev": [], "final": []}
    counts: dict[str, dict[str, int]] = {}
    for category, (questions, answers) in categories.items():
        picked = {"dev": 0, "final": 0, "passed_over": 0}
        for question in sorted(questions, key=lambda q: order_key(q["id"])):
            target = ("dev" if picked["dev"] < per_category
                      else "final" if picked["final"] < final_per_category
                      else "dev" if picked["dev"] < per_category + more_per_category else None)
            if target is None:
                break
            task_id = question["id"]
            if len(question["question"]) != 1:
                raise SystemExit(f"{task_id}: {len(question['question'])} turns; only single-turn categories")
            tools = to_tools(question["function"], task_id)
            if category == "irrelevance":
                replies: list | None = [{"role": "assistant", "content": NO_CALL_REPLY}]
            else:
                if task_id not in answers:
                    raise SystemExit(f"{task_id}: no possible answer")
                replies = reference_replies(answers[task_id], tools, limit)
            if replies is None:
                picked["passed_over"] += 1
                continue
            request = {"task_id": task_id, "category": category, "messages": question["question"][0],
                       "tools": tools}
            sets[target].append((request, replies))
            picked[target] += 1
        picked["source_requests"] = len(questions)
        counts[category] = picked
    return sets, counts


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """One compact JSON object per line, keys in a fixed order, UTF-8."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def main() -> None:
    """Parse options, build, write ``requests.jsonl``/``references.jsonl`` and ``final_check/``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--source", type=Path, help="folder holding BFCL_v4_*.json and possible_answer/")
    group.add_argument("--git-dir", type=Path, help="a git directory of ShishirPatil/gorilla")
    parser.add_argument("--commit", default="HEAD", help="commit to read with --git-dir")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--per-category", type=int, default=50)
    parser.add_argument("--final-per-category", type=int, default=20)
    parser.add_argument("--more-per-category", type=int, default=50,
                        help="development requests taken after the final check's (it stays the same)")
    parser.add_argument("--max-alternatives", type=int, default=64)
    args = parser.parse_args()
    categories = {c: load_category(c, args.source, args.git_dir, args.commit) for c in CATEGORIES}
    sets, counts = build(categories, args.per_category, args.final_per_category, args.max_alternatives,
                         args.more_per_category)
    for name, folder in (("dev", args.out), ("final", args.out / "final_check")):
        write_jsonl(folder / "requests.jsonl", [request for request, _ in sets[name]])
        write_jsonl(folder / "references.jsonl", [{"task_id": request["task_id"], "reply": reply}
                                                  for request, replies in sets[name] for reply in replies])
    print(json.dumps({**counts, "invalid_alternatives_dropped": INVALID_DROPPED[0]}, sort_keys=True))


if __name__ == "__main__":
    main()
