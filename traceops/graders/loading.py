"""``load_grader``: a grader from its spec string, as a domain's params.yaml names it.

Specs: ``tool_call_match``, ``string_check``, ``json_schema`` (the built-ins), ``python:module:function``
(a user's callable, imported; settings are passed to it as keywords on every call) and
``llm:http(s)://host[:port][/v1]#model`` (an LLM judge at an OpenAI-compatible endpoint, probed when
loaded so an unreachable one fails before any grading). A wrong spec or setting raises ConfigError
naming it and what to send instead.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from traceops.errors import ConfigError
from traceops.graders.base import Grader
from traceops.graders.judge import LLMJudge
from traceops.graders.text import JsonSchemaCheck, StringCheck
from traceops.graders.toolcalls import tool_call_match
from traceops.model.openai_compat import public_url

BUILTIN_GRADERS: tuple[str, ...] = ("tool_call_match", "string_check", "json_schema")
PYTHON_PREFIX = "python:"
LLM_PREFIX = "llm:"
_SPECS_HINT = ("send one of tool_call_match, string_check, json_schema, python:module:function or "
               "llm:http(s)://host/v1#model")
_JUDGE_SETTINGS = ("criteria", "max_new_tokens", "seed")
_ENDPOINT_SETTINGS = ("api_key_env", "timeout")


def _built(spec: str, factory: Any, config: dict[str, Any]) -> Grader:
    """``factory(**config)``, with a wrong or missing setting as a ConfigError naming the grader."""
    try:
        return factory(**config)
    except TypeError as exc:
        raise ConfigError(f"grader '{spec}': bad settings {sorted(config)}: {exc}") from None


def _python_grader(spec: str, config: dict[str, Any]) -> Grader:
    """The callable ``module:function`` names (``function`` may be dotted, e.g. ``Class.method``)."""
    module_name, _, attr = spec[len(PYTHON_PREFIX):].partition(":")
    if not module_name or not attr:
        raise ConfigError(f"grader '{spec}' must be python:module:function, e.g. python:my_pkg.graders:score")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # importing runs the user's module: any error is a wrong setting
        raise ConfigError(f"grader '{spec}': cannot import module '{module_name}' "
                          f"({type(exc).__name__}: {exc}); make it importable (on PYTHONPATH) or "
                          f"{_SPECS_HINT}") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"grader '{spec}': module '{module_name}' has no '{attr}'; name a function "
                              "defined in it")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"grader '{spec}': '{attr}' is a {type(target).__name__}, not callable; name a "
                          "function (messages, tools, reply, reference) -> float in [0, 1]")
    return functools.partial(target, **config) if config else target


def _llm_judge(spec: str, config: dict[str, Any]) -> Grader:
    """An LLMJudge over the OpenAI-compatible endpoint ``spec`` names (``llm:URL#model``)."""
    from traceops.model import load_model  # the model package is heavy; only a judge needs it

    target = spec[len(LLM_PREFIX):].strip()
    if not target.startswith(("http://", "https://")):
        raise ConfigError(f"grader '{LLM_PREFIX}{public_url(target)}' must name an OpenAI-compatible "
                          "endpoint: llm:http(s)://host[:port]/v1#model")
    unknown = sorted(set(config) - set(_JUDGE_SETTINGS) - set(_ENDPOINT_SETTINGS))
    if unknown:
        raise ConfigError(f"grader '{LLM_PREFIX}{public_url(target)}': unknown settings {unknown}; it takes "
                          f"{list(_JUDGE_SETTINGS + _ENDPOINT_SETTINGS)}")
    endpoint = {key: config[key] for key in _ENDPOINT_SETTINGS if key in config}
    judge = {key: config[key] for key in _JUDGE_SETTINGS if key in config}
    url = target.partition("#")[0]
    return LLMJudge(load_model(target, **endpoint), endpoint=public_url(url), **judge)


def load_grader(spec: str, **config: Any) -> Grader:
    """The grader ``spec`` names, with its ``config`` settings (see the module docstring).

    Raises ConfigError for an unknown spec, a bad setting or a user grader that cannot be imported or
    is not callable; ModelError when an LLM judge's endpoint cannot be reached.
    """
    text = str(spec).strip()
    if text == "tool_call_match":
        if config:
            raise ConfigError(f"grader 'tool_call_match' takes no settings, got {sorted(config)}")
        return tool_call_match
    if text == "string_check":
        return _built(text, StringCheck, config)
    if text == "json_schema":
        if "schema" not in config:
            raise ConfigError("grader 'json_schema' needs schema=, a JSON-schema object the reply must meet")
        return _built(text, JsonSchemaCheck, config)
    if text.startswith(PYTHON_PREFIX):
        return _python_grader(text, config)
    if text.startswith(LLM_PREFIX):
        return _llm_judge(text, config)
    shown = public_url(text) if text.startswith(("http://", "https://")) else text
    raise ConfigError(f"unknown grader '{shown}'; {_SPECS_HINT}")
