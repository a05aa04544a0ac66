"""Model backends behind one ``ChatModel`` contract, and ``load_model`` to pick one from a string.

Specs understood by ``load_model``:

- ``embedded``: SmolLM2-135M-Instruct from the packaged GGUF, converted once into the cache. Its Hub
  id ``HuggingFaceTB/SmolLM2-135M-Instruct`` means the same (lineage records that id plus the
  converted weights' hash, so a recorded base model reloads offline).
- an existing folder: a local Hugging Face model with safetensors weights (``LocalChatModel``).
- ``http(s)://host[:port][/v1]#model``: an OpenAI-compatible endpoint (``OpenAIChatModel``). The
  model name is the URL fragment; the ``model=`` keyword overrides it; with neither, the endpoint
  must list exactly one model (``traceops serve`` of one model does; one serving a registry lists the
  champion, its base and the adapters, so name one, e.g. ``#traceops.composite``).
- anything else: a Hugging Face Hub id, used from the local cache or downloaded when the Hub is
  reachable; otherwise a ModelError says what to pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traceops.model.base import ChatModel, Completion, GenerationConfig, ModelInfo
from traceops.model.embedded import EMBEDDED_MODEL_ID, embedded_model_dir, embedded_weights_hash

EMBEDDED_SPEC = "embedded"

__all__ = [
    "EMBEDDED_MODEL_ID",
    "EMBEDDED_SPEC",
    "ChatModel",
    "Completion",
    "GenerationConfig",
    "ModelInfo",
    "embedded_model_dir",
    "load_model",
]


def load_model(spec: str, *, model: str | None = None, device: str = "cpu", dtype: Any = "float32",
               api_key_env: str = "OPENAI_API_KEY", timeout: float = 120.0, batch_size: int = 8) -> ChatModel:
    """A ChatModel for ``spec`` (see the module docstring). Raises ModelError with what to do."""
    from traceops.model.local import LocalChatModel
    from traceops.model.openai_compat import OpenAIChatModel

    text = str(spec).strip()
    if text == EMBEDDED_SPEC or (text == EMBEDDED_MODEL_ID and not Path(text).exists()):
        folder = embedded_model_dir()
        return LocalChatModel(folder, device=device, dtype=dtype, model_id=EMBEDDED_MODEL_ID,
                              weights_hash=embedded_weights_hash(folder), batch_size=batch_size)
    if text.startswith(("http://", "https://")):
        url, _, fragment = text.partition("#")
        return OpenAIChatModel(url, model=model or fragment or None, api_key_env=api_key_env, timeout=timeout)
    return LocalChatModel(text, device=device, dtype=dtype, batch_size=batch_size)
