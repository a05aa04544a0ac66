"""Graders: score a reply to a request in [0, 1] (DESIGN.md, Contracts: Grader).

A grader is ``(messages, tools, reply, reference | None) -> float in [0, 1]``. The built-ins
(``tool_call_match``, ``string_check``, ``json_schema``) are deterministic; ``load_grader`` also loads
``python:module:function`` and an LLM judge at ``llm:URL#model``. Run graders through ``grade``,
which turns a grader that raises or returns a non-score into a recorded problem naming the file,
record and field, so a night goes on and nothing is silently dropped.

Modules: ``base`` (the contract, ``grade``, replies from model text), ``toolcalls``, ``text``,
``judge`` and ``loading``.
"""

from __future__ import annotations

from traceops.graders.base import Grader, GradeResult, grade, reply_from_text
from traceops.graders.judge import LLMJudge
from traceops.graders.loading import BUILTIN_GRADERS, load_grader
from traceops.graders.text import JsonSchemaCheck, StringCheck
from traceops.graders.toolcalls import tool_call_match

__all__ = [
    "BUILTIN_GRADERS",
    "GradeResult",
    "Grader",
    "JsonSchemaCheck",
    "LLMJudge",
    "StringCheck",
    "grade",
    "load_grader",
    "reply_from_text",
    "tool_call_match",
]
