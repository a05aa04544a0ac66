"""MLflow pyfunc models of traceops' trained weights, logged as "models from code".

Each model file (``adapter_model.py``, ``composite_model.py``) defines a ``PythonModel`` and calls
``mlflow.models.set_model``; MLflow copies the file into the logged model and runs it at load time, so
nothing is pickled. The logged artifacts are the small trained folder (PEFT adapter or ``save_moe``
composite); the base model is referenced by ``model_config["base_model"]`` and resolved on the loading
machine with ``traceops.model.reference.resolve_base_model``, its weights hash checked against
``base_model_ref``. ``registration`` logs and registers them.

Input: a DataFrame with a ``messages`` column (JSON list of chat messages) and an optional ``tools``
column (JSON list of OpenAI function specs); output: the generated assistant text per row. Params:
``max_new_tokens``, ``temperature``, ``seed``. Works with ``mlflow.pyfunc.load_model`` and
``mlflow models serve -m models:/traceops.composite@champion --env-manager local``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd

from traceops.errors import InputError, ModelError
from traceops.model.base import ChatModel, GenerationConfig, tools_of_batch

MODELS_DIR = Path(__file__).resolve().parent
KINDS = {"adapter": "adapter_model.py", "composite": "composite_model.py"}
DEFAULT_MAX_NEW_TOKENS = 256


def model_code_path(kind: str) -> Path:
    """The models-from-code file of ``kind`` (``adapter`` or ``composite``)."""
    if kind not in KINDS:
        raise ModelError(f"no pyfunc model of kind '{kind}'; kinds: {', '.join(KINDS)}")
    return MODELS_DIR / KINDS[kind]


def signature() -> Any:
    """Input ``messages`` (+ optional ``tools``) as JSON strings, output text, generation params."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    inputs = Schema([ColSpec("string", "messages"), ColSpec("string", "tools", required=False)])
    outputs = Schema([ColSpec("string")])
    params = ParamSchema([ParamSpec("max_new_tokens", "long", DEFAULT_MAX_NEW_TOKENS),
                          ParamSpec("temperature", "double", 0.0), ParamSpec("seed", "long", 0)])
    return ModelSignature(inputs=inputs, outputs=outputs, params=params)


def base_model_dir(model_config: dict[str, Any]) -> Path:
    """The local folder of the model's base, verified against the weights hash recorded at logging."""
    from traceops.model.reference import resolve_base_model

    spec = model_config.get("base_model")
    if not spec:
        raise ModelError("the logged model's model_config has no 'base_model'; re-register it with "
                         "traceops.mlflow_models.registration")
    folder, ref = resolve_base_model(str(spec))
    expected = model_config.get("base_model_ref")
    if expected and ref != expected:
        raise ModelError(f"base model '{spec}' on this machine is {ref}, but the model was trained on "
                         f"{expected}; install or point base_model at the same weights")
    return folder


def _cell(value: Any) -> Any:
    """A DataFrame cell as Python data: JSON strings parsed, NaN/None/"" as None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        return json.loads(value) if value.strip() else None
    return value


def parse_rows(model_input: Any) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    """(messages, tools) per input row; InputError naming the row when one is malformed."""
    frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
    if "messages" not in frame.columns:
        raise InputError("the input needs a 'messages' column (a JSON list of chat messages)",
                         field="messages")
    has_tools = "tools" in frame.columns
    rows = []
    for i in range(len(frame)):
        try:
            messages = _cell(frame["messages"].iloc[i])
            tools = _cell(frame["tools"].iloc[i]) if has_tools else None
        except json.JSONDecodeError as exc:
            raise InputError(f"not valid JSON ({exc})", record=i) from exc
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and "role" in m for m in messages):
            raise InputError("'messages' must be a non-empty JSON list of {role, content} objects",
                             record=i, field="messages")
        if tools is not None and not isinstance(tools, list):
            raise InputError("'tools' must be a JSON list of function specs", record=i, field="tools")
        rows.append((messages, tools))
    return rows


class ChatPyfunc(mlflow.pyfunc.PythonModel):
    """A traceops ChatModel behind the pyfunc interface; subclasses say how to load it."""

    artifact_key = ""
    loader: Callable[[Path, Path, int], ChatModel]

    def load_context(self, context: Any) -> None:
        """Resolve the base model and load it with the logged folder on top."""
        config = dict(context.model_config or {})
        folder = Path(context.artifacts[self.artifact_key])
        self.chat = type(self).loader(base_model_dir(config), folder, int(config.get("batch_size", 8)))

    # A DataFrame hint: MLflow infers no schema from it (signature() describes the input) and warns
    # about neither a missing nor an unsupported hint.
    def predict(self, context: Any, model_input: pd.DataFrame,
                params: dict[str, Any] | None = None) -> list[str]:
        """The assistant text for each row, rows generated in batches, each with its own tools."""
        params = params or {}
        config = GenerationConfig(max_new_tokens=int(params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)),
                                  temperature=float(params.get("temperature", 0.0)),
                                  seed=int(params.get("seed", 0)))
        rows = parse_rows(model_input)
        return self.chat.generate([messages for messages, _ in rows],
                                  tools_of_batch([tools or None for _, tools in rows]), config)
