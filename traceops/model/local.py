"""A Hugging Face causal LM in a local folder as a ChatModel: batched, left-padded generation.

Weights load only from safetensors (``use_safetensors=True``): a folder holding only pickled
``*.bin``/``*.pt`` weights is refused, since unpickling runs arbitrary code. A Hub id is resolved
from the local Hugging Face cache first; downloading is tried only when the Hub answers, so an
unknown id or an offline machine fails at once with a message saying what to pass instead.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from traceops.errors import ModelError
from traceops.model.base import Completion, GenerationConfig, ModelInfo
from traceops.model.embedded import read_manifest, safetensors_hash
from traceops.model.toolcalls import render_prompt

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_WEIGHT_PATTERNS = ["*.safetensors", "*.json", "*.jinja", "*.txt", "*.model", "tokenizer*"]


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face endpoint accepts a TCP connection (offline mode counts as no)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    parsed = urlparse(constants.ENDPOINT)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def resolve_model_folder(path_or_hub_id: str | Path) -> Path:
    """A local folder with safetensors weights for a folder path or a Hub id.

    Raises ModelError naming what was tried and what to pass instead.
    """
    path = Path(path_or_hub_id).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelError(f"{path}: expected a model folder (config.json + *.safetensors), got a file")
        if not any(path.glob("*.safetensors")):
            raise ModelError(
                f"{path}: no *.safetensors weights; traceops never unpickles *.bin/*.pt weights. "
                "Re-save the model with save_pretrained(..., safe_serialization=True)"
            )
        return path.resolve()
    spec = str(path_or_hub_id)
    if not _HUB_ID.match(spec):
        raise ModelError(f"model '{spec}': no such folder and not a Hugging Face Hub id; pass 'embedded', "
                         "a folder with config.json and *.safetensors, or an http(s):// endpoint")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(spec, allow_patterns=_WEIGHT_PATTERNS, local_files_only=True))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError):
        if not _hub_reachable():
            raise ModelError(
                f"model '{spec}' is not in the local Hugging Face cache and the Hub cannot be reached; "
                "pass 'embedded' (the bundled SmolLM2-135M-Instruct), a local folder with safetensors "
                "weights, or an http(s):// OpenAI-compatible endpoint"
            ) from None
        try:
            folder = Path(snapshot_download(spec, allow_patterns=_WEIGHT_PATTERNS))
        except Exception as exc:  # the hub client raises many types; one message is what helps
            raise ModelError(f"model '{spec}': download from the Hugging Face Hub failed ({exc}); check the "
                             "id and your access token, or pass a local folder") from exc
    if not any(folder.glob("*.safetensors")):
        raise ModelError(f"model '{spec}' has no safetensors weights on the Hub; traceops loads only "
                         "safetensors. Convert it locally and pass the folder")
    return folder


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if dtype is None or dtype == "auto":
        return "auto" if dtype == "auto" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        value = getattr(torch, str(dtype))
    except AttributeError:
        value = None
    if not isinstance(value, torch.dtype):
        raise ModelError(f"dtype '{dtype}' is not a torch dtype; use float32, bfloat16, float16 or auto")
    return value


class LocalChatModel:
    """A causal LM plus its tokenizer, generating chat completions in left-padded batches.

    ``model`` and ``tokenizer`` are public so training code can wrap the same objects (PEFT);
    ``from_objects`` builds one around already-loaded objects (an adapter-wrapped model, say).
    """

    def __init__(self, path_or_hub_id: str | Path, device: str = "cpu", dtype: Any = "float32",
                 model_id: str | None = None, weights_hash: str | None = None, batch_size: int = 8) -> None:
        """Load from a folder (or Hub id). ``weights_hash`` defaults to the folder's recorded
        manifest hash, else the sha256 of its safetensors files."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = resolve_model_folder(path_or_hub_id)
        manifest = read_manifest(folder) or {}
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder))
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=_torch_dtype(dtype),
                                                         use_safetensors=True)
        except ModelError:
            raise
        except Exception as exc:  # transformers raises many types; name the folder and the fix
            raise ModelError(f"{folder}: could not load model/tokenizer ({exc}); the folder needs "
                             "config.json, *.safetensors and tokenizer files") from exc
        model.to(device)
        info = ModelInfo(
            model_id=model_id or str(manifest.get("model_id") or path_or_hub_id),
            weights_hash=weights_hash or str(manifest.get("weights_sha256") or safetensors_hash(folder)),
            extra={"backend": "local", "path": str(folder), "dtype": str(model.dtype), "device": device},
        )
        self._setup(model, tokenizer, info, batch_size)

    @classmethod
    def from_objects(cls, model: Any, tokenizer: Any, info: ModelInfo, batch_size: int = 8) -> LocalChatModel:
        """Wrap an already-loaded model and tokenizer (no loading, no hashing)."""
        instance = cls.__new__(cls)
        instance._setup(model, tokenizer, info, batch_size)
        return instance

    def _setup(self, model: Any, tokenizer: Any, info: ModelInfo, batch_size: int) -> None:
        if batch_size < 1:
            raise ModelError(f"batch_size must be at least 1, got {batch_size}")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.info = info
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return (f"LocalChatModel(model_id={self.info.model_id!r}, "
                f"weights_hash={self.info.weights_hash[:12]!r})")

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, (list, tuple)):
                ids.update(int(i) for i in source)
        return ids

    def _hf_generation_config(self, config: GenerationConfig) -> Any:
        from transformers import GenerationConfig as HFGenerationConfig

        sample = config.temperature > 0
        eos = sorted(self._eos_ids())
        return HFGenerationConfig(
            max_new_tokens=config.max_new_tokens,
            do_sample=sample,
            temperature=config.temperature if sample else None,
            top_p=config.top_p if sample else None,
            top_k=0 if sample else None,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=eos if len(eos) > 1 else eos[0],
            stop_strings=list(config.stop) if config.stop else None,
        )

    def complete(self, conversations: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None = None,
                 config: GenerationConfig | None = None) -> list[Completion]:
        """One completion per conversation with token counts, generated in batches of ``batch_size``.

        Greedy when ``config.temperature`` is 0; otherwise sampled under ``config.seed`` (offset by the
        batch's start index), without touching the global random state. Text is cut before the first
        stop string (OpenAI semantics: the stop string itself is not returned).
        """
        import torch

        config = config or GenerationConfig()
        hf_config = self._hf_generation_config(config)
        prompts = [render_prompt(self.tokenizer, conversation, tools) for conversation in conversations]
        # Generation pads finished rows with pad_token_id: it ends a row just like end-of-turn.
        pad = self.tokenizer.pad_token_id
        eos = self._eos_ids() | ({pad} if pad is not None else set())
        device = next(self.model.parameters()).device
        rng_devices = [device.index or 0] if device.type == "cuda" else []
        results: list[Completion] = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = prompts[start:start + self.batch_size]
            encoded = self.tokenizer(chunk, return_tensors="pt", padding=True, padding_side="left",
                                     add_special_tokens=False).to(device)
            extra = {"tokenizer": self.tokenizer} if config.stop else {}
            with torch.random.fork_rng(devices=rng_devices), torch.inference_mode():
                torch.manual_seed(config.seed + start)
                output = self.model.generate(**encoded, generation_config=hf_config, **extra)
            new_tokens = output[:, encoded["input_ids"].shape[1]:].tolist()
            prompt_lengths = encoded["attention_mask"].sum(dim=1).tolist()
            for row, prompt_length in zip(new_tokens, prompt_lengths, strict=True):
                results.append(self._finish(row, int(prompt_length), eos, config))
        return results

    def _finish(self, row: list[int], prompt_length: int, eos: set[int],
                config: GenerationConfig) -> Completion:
        """Cut one generated row at end-of-turn and at the first stop string."""
        end = next((i for i, token in enumerate(row) if token in eos), None)
        tokens = row if end is None else row[:end]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        finish = "length" if end is None else "stop"
        cuts = [text.find(stop) for stop in config.stop if stop and stop in text]
        if cuts:
            text, finish = text[:min(cuts)], "stop"
        return Completion(text=text, prompt_tokens=prompt_length, completion_tokens=len(tokens),
                          finish_reason=finish)

    def generate(self, conversations: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None = None,
                 config: GenerationConfig | None = None) -> list[str]:
        """One assistant text per conversation (see ``complete``)."""
        return [completion.text for completion in self.complete(conversations, tools, config)]
