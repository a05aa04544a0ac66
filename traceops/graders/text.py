"""Graders of a reply's text: ``string_check`` (equals or contains) and ``json_schema`` (valid JSON
that satisfies a schema). Both are deterministic and score 1 or 0."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from traceops.diagnose.jsonschema_check import violations
from traceops.errors import ConfigError, InputError
from traceops.graders.base import reply_text, unfence
from traceops.schema import Message, ToolSpec

StringMode = Literal["equals", "contains"]
STRING_MODES: tuple[str, ...] = ("equals", "contains")

@dataclass(frozen=True)
class StringCheck:
    """The reply's text against the expected text: ``equals`` (the whole text) or ``contains`` (the
    expected text appears in it), after stripping surrounding whitespace, case-insensitive unless
    ``case_sensitive``. The expected text is ``expected`` when set, else the reference's content."""

    mode: StringMode = "equals"
    case_sensitive: bool = False
    expected: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in STRING_MODES:
            raise ConfigError(f"string_check mode must be one of {list(STRING_MODES)}, got {self.mode!r}")

    def __call__(self, messages: list[Message], tools: list[ToolSpec], reply: Message,
                 reference: Message | None) -> float:
        """1.0 when the reply's text passes the check, else 0.0."""
        expected = self.expected if self.expected is not None else (
            reference.content if reference is not None else None)
        if expected is None:
            raise InputError("string_check has no expected text: the reference reply has no content and "
                             "no expected= is configured", field="reference")
        got, want = reply_text(reply).strip(), expected.strip()
        if not self.case_sensitive:
            got, want = got.casefold(), want.casefold()
        passed = got == want if self.mode == "equals" else want in got
        return 1.0 if passed else 0.0


@dataclass(frozen=True)
class JsonSchemaCheck:
    """The reply's text parses as JSON (the whole text, or one code fence around all of it) and
    satisfies ``schema``. The schema is checked by ``diagnose.jsonschema_check``: type, required,
    enum, properties, items and ``additionalProperties: false``; other keywords are not checked."""

    schema: dict[str, Any]

    def __post_init__(self) -> None:
        if not isinstance(self.schema, dict):
            raise ConfigError(f"json_schema needs schema= a JSON-schema object, got "
                              f"{type(self.schema).__name__}; e.g. schema={{'type': 'object'}}")

    def problems(self, reply: Message) -> list[str]:
        """Why the reply's text fails: it is not JSON, or each schema violation; empty when it passes."""
        try:
            value = json.loads(unfence(reply_text(reply)))
        except json.JSONDecodeError as exc:
            return [f"the reply is not JSON: {exc.msg} at character {exc.pos}"]
        return violations(value, self.schema)

    def __call__(self, messages: list[Message], tools: list[ToolSpec], reply: Message,
                 reference: Message | None) -> float:
        """1.0 when the reply's text is JSON satisfying the schema, else 0.0."""
        return 0.0 if self.problems(reply) else 1.0
