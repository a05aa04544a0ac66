"""A Hugging Face causal LM in a local folder as a ChatModel: batched generation, shared-prefix KV cache.

Agent prompts are mostly one long shared prefix (system prompt plus the tools' JSON schemas: about
2,400 of 2,470 tokens in the retail domain), identical across a batch and across turns. With
``prefix_cache`` on (the default for models loaded from a folder), a batch's longest common token
prefix is run through the model once, at batch 1, and its keys and values are kept: later batches
that start with the same tokens (the next turn, the next episode) reuse them and only compute what
is new. A batch is laid out as ``[shared prefix][padding][row's own tokens]``; position ids come
from the attention mask, so every token sits at the position it has in the uncached, left-padded
batch. Under SDPA the prefix's keys and values stay at batch 1 and attention is split into a prefix
part read once for all rows and each row's own part (``shared_prefix``); otherwise, and for a batch
of one, the prefix is copied to every row. The cache grows in place in
preallocated room (``GrowingLayer``) instead of concatenating the whole cache every new token.
Greedy output is the same tokens as without the cache (tested on the tiny and the embedded model).

Weights load only from safetensors (``use_safetensors=True``): a folder holding only pickled
``*.bin``/``*.pt`` weights is refused, since unpickling runs arbitrary code. A Hub id is resolved
from the local Hugging Face cache first; downloading is tried only when the Hub answers, so an
unknown id or an offline machine fails at once with a message saying what to pass instead.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from traceops.errors import ModelError
from traceops.model import shared_prefix
from traceops.model.base import Completion, GenerationConfig, ModelInfo, Tools, tools_per_conversation
from traceops.model.embedded import read_manifest, safetensors_hash
from traceops.model.hub_kernels import kernel_kwargs
from traceops.model.kv_cache import (
    growing_layer_class,
    prefix_layout,
    shared_length,
    shared_prefix_layer,
    supports_prefix_cache,
)
from traceops.model.prefix_batches import decode_step_tokens, prefix_batches
from traceops.model.toolcalls import render_prompt

# Prefixes kept at once, one per routing state (a composite generating one group per expert); each is
# the prefix's keys and values at batch 1 (about 46 MB per 1,000 tokens for the embedded model).
PREFIX_SLOTS = 8
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
                 model_id: str | None = None, weights_hash: str | None = None, batch_size: int = 8,
                 prefix_cache: bool = True) -> None:
        """Load from a folder (or Hub id). ``weights_hash`` defaults to the folder's recorded
        manifest hash, else the sha256 of its safetensors files. ``prefix_cache`` reuses the keys
        and values of shared prompt prefixes (see the module docstring)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = resolve_model_folder(path_or_hub_id)
        manifest = read_manifest(folder) or {}
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder))
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=_torch_dtype(dtype),
                                                         use_safetensors=True, **kernel_kwargs())
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
        self._setup(model, tokenizer, info, batch_size, prefix_cache)

    @classmethod
    def from_objects(cls, model: Any, tokenizer: Any, info: ModelInfo, batch_size: int = 8,
                     prefix_cache: bool = False) -> LocalChatModel:
        """Wrap an already-loaded model and tokenizer (no loading, no hashing).

        ``prefix_cache`` is off by default here: it is only exact when a token's keys and values
        depend on the tokens before it alone, which wrapped models (say, routing once per request
        over the whole prompt) need not satisfy. Turn it on for plain or merged-adapter models.
        """
        instance = cls.__new__(cls)
        instance._setup(model, tokenizer, info, batch_size, prefix_cache)
        return instance

    def _setup(self, model: Any, tokenizer: Any, info: ModelInfo, batch_size: int,
               prefix_cache: bool = False) -> None:
        if batch_size < 1:
            raise ModelError(f"batch_size must be at least 1, got {batch_size}")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.info = info
        self.batch_size = batch_size
        self.prefix_cache = prefix_cache
        self._prefixes: dict[tuple[Any, ...], _StoredPrefix] = {}  # routing state -> prefix, oldest first
        self._rows: list[_StoredRow] = []  # last batches' rows past their prefix, oldest first
        self._cache_ok: bool | None = None

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

    def complete(self, conversations: list[list[dict[str, Any]]], tools: Tools = None,
                 config: GenerationConfig | None = None) -> list[Completion]:
        """One completion per conversation with token counts, generated in batches of at most
        ``batch_size`` (each conversation rendered with its own tools when ``tools`` is a ``ToolsEach``);
        with the prefix cache, the batches are ``generation_batches``'.

        Greedy when ``config.temperature`` is 0; otherwise sampled under ``config.seed`` (offset by the
        batch's start index), without touching the global random state. Text is cut before the first
        stop string (OpenAI semantics: the stop string itself is not returned).
        """
        import torch

        config = config or GenerationConfig()
        hf_config = self._hf_generation_config(config)
        prompts = [render_prompt(self.tokenizer, conversation, offered) for conversation, offered
                   in zip(conversations, tools_per_conversation(tools, len(conversations)), strict=True)]
        # Generation pads finished rows with pad_token_id: it ends a row just like end-of-turn.
        pad = self.tokenizer.pad_token_id
        eos = self._eos_ids() | ({pad} if pad is not None else set())
        device = next(self.model.parameters()).device
        rng_devices = [device.index or 0] if device.type == "cuda" else []
        cached = self.prefix_cache and self._supports_prefix_cache()
        if cached:
            rows = [list(ids) for ids in self.tokenizer(prompts, add_special_tokens=False)["input_ids"]]
            batches = self.generation_batches(rows, hf_config.max_new_tokens)
        else:
            rows = []
            batches = [range(s, min(s + self.batch_size, len(prompts))) for s in range(0, len(prompts),
                                                                                       self.batch_size)]
        results: list[Completion] = []
        for batch in batches:
            extra = {"tokenizer": self.tokenizer} if config.stop else {}
            with torch.random.fork_rng(devices=rng_devices), torch.inference_mode():
                torch.manual_seed(config.seed + batch.start)
                if cached:
                    chunk_rows = rows[batch.start:batch.stop]
                    new_tokens = self.generate_rows(chunk_rows, hf_config, extra, device)
                    prompt_lengths = [len(row) for row in chunk_rows]
                else:
                    encoded = self.tokenizer(prompts[batch.start:batch.stop], return_tensors="pt",
                                             padding=True, padding_side="left",
                                             add_special_tokens=False).to(device)
                    output = self.model.generate(**encoded, generation_config=hf_config, **extra)
                    new_tokens = output[:, encoded["input_ids"].shape[1]:].tolist()
                    prompt_lengths = encoded["attention_mask"].sum(dim=1).tolist()
            for row, prompt_length in zip(new_tokens, prompt_lengths, strict=True):
                results.append(self._finish(row, int(prompt_length), eos, config))
        return results

    # -----------------------------------------------------------------------------------------------
    # Shared-prefix KV cache

    def _supports_prefix_cache(self) -> bool:
        """Whether every attention layer keeps a plain growing KV cache (no sliding window, no
        linear attention): only then is a prefix's cache valid for any continuation."""
        if self._cache_ok is None:
            self._cache_ok = supports_prefix_cache(self.model.config)
        return self._cache_ok

    def _weights_state(self) -> tuple[Any, ...]:
        """Changes whenever the weights may have: training mode, parameter set, in-place updates."""
        return (self.model.training, tuple((id(p), p._version) for p in self.model.parameters()))

    def _routing_state(self) -> tuple[Any, ...]:
        """What besides the weights decides a prefix's keys and values (nothing for a plain model; a
        composite's mode, top-k and forced gate)."""
        return ()

    @property
    def _prefix(self) -> _StoredPrefix | None:
        """The most recently used stored prefix (None before the first)."""
        return next(reversed(self._prefixes.values()), None)

    def _prefix_kv(self, tokens: list[int], device: Any) -> list[tuple[Any, Any]]:
        """Keys and values (batch 1) of ``tokens`` per layer, reusing the prefix stored for the current
        weights and routing where it matches."""
        import torch

        weights, routing = self._weights_state(), self._routing_state()
        if any(stored.state != weights for stored in self._prefixes.values()):
            self._prefixes.clear()  # the weights changed: every stored prefix is stale
        stored = self._prefixes.pop(routing, None)
        matched = len(os.path.commonprefix([stored.tokens, tokens])) if stored is not None else 0
        if stored is not None and matched == len(tokens):
            self._prefixes[routing] = stored  # most recently used last
            return [(k[:, :, :matched], v[:, :, :matched]) for k, v in stored.layers]
        reused = [(k[:, :, :matched], v[:, :, :matched]) for k, v in stored.layers] if matched else None
        cache = self._growing_cache(reused, batch=1, capacity=len(tokens))
        ids = torch.tensor([tokens[matched:]], dtype=torch.long, device=device)
        self.model(input_ids=ids, cache=cache, use_cache=True, **self._no_logits())
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        self._prefixes[routing] = _StoredPrefix(state=weights, tokens=list(tokens), layers=layers)
        while len(self._prefixes) > PREFIX_SLOTS:
            self._prefixes.pop(next(iter(self._prefixes)))
        return layers

    def _no_logits(self) -> dict[str, Any]:
        """Forward kwargs that skip the LM head for all but the last position, where supported: the
        head over a 50k vocabulary costs a quarter of a prefix pass, and only keys/values are kept."""
        import inspect

        accepted = inspect.signature(self.model.forward).parameters
        return {"logits_to_keep": 1} if "logits_to_keep" in accepted else {}

    def _growing_cache(self, prefix: list[tuple[Any, Any]] | None, batch: int, capacity: int) -> Any:
        """A DynamicCache of ``GrowingLayer``s holding ``prefix`` (copied to ``batch`` rows)."""
        from transformers import DynamicCache

        growing = growing_layer_class()
        cache = DynamicCache(config=self.model.config)
        if prefix is None:
            cache.layers = [growing(capacity) for _ in cache.layers]
        else:
            cache.layers = [growing(capacity, k, v, batch) for k, v in prefix]
        return cache

    def _batch_cache(self, prefix: list[tuple[Any, Any]] | None, batch: int, capacity: int,
                     own: list[tuple[Any, Any]] | None = None
                     ) -> tuple[Any, contextlib.AbstractContextManager[Any]]:
        """The cache a batch of ``batch`` rows starts from, and the context to generate in.

        Several rows behind a prefix, on SDPA: the prefix stays at batch 1, read once per step for all
        rows (``shared_prefix``). One row, or another attention: the prefix copied into each row
        (at batch 1 the copy is cheaper than splitting attention in two). ``own``: per layer, the
        first columns of the rows' own part already computed (``_reused_rows``), placed behind the prefix.
        """
        if prefix is not None and batch > 1 and shared_prefix.supported(self.model):
            from transformers import DynamicCache

            room = capacity - prefix[0][0].shape[-2]
            cache = DynamicCache(config=self.model.config)
            cache.layers = [shared_prefix_layer(room, k, v) for k, v in prefix]
            for layer, (k, v) in zip(cache.layers, own or [], strict=False):
                layer._adopt(k, v)
            return cache, shared_prefix.attention_over(self.model, cache)
        if prefix is not None and own is not None:
            import torch

            prefix = [(torch.cat([pk.expand(batch, -1, -1, -1), k], dim=2),
                       torch.cat([pv.expand(batch, -1, -1, -1), v], dim=2))
                      for (pk, pv), (k, v) in zip(prefix, own, strict=True)]
        return self._growing_cache(prefix, batch=batch, capacity=capacity), contextlib.nullcontext()

    def generation_batches(self, rows: list[list[int]], max_new_tokens: int) -> list[range]:
        """The batches (of at most ``batch_size``) ``complete`` generates ``rows`` (prompt token ids) in
        with the prefix cache: rows in order, a row that would cut its batch's shared prefix short
        batched apart when that costs less than decoding another batch (``prefix_batches``)."""
        device = next(self.model.parameters()).device
        step = decode_step_tokens(device.type)
        return prefix_batches(rows, self.batch_size, batch_cost=step * max_new_tokens)

    def generate_rows(self, rows: list[list[int]], hf_config: Any, extra: dict[str, Any] | None = None,
                      device: Any = None) -> list[list[int]]:
        """New tokens for each prompt row (token ids) under the HF ``hf_config``, from the shared-prefix
        cache; rows that finish early are padded with ``pad_token_id`` (as ``generate`` pads them).
        Samples from the global random state when ``hf_config`` samples (callers seed it)."""
        device = device if device is not None else next(self.model.parameters()).device
        shared = shared_length(rows)
        prefix = self._prefix_kv(rows[0][:shared], device) if shared else None
        input_ids, mask = prefix_layout(rows, shared, self.tokenizer.pad_token_id)
        width = input_ids.shape[1]
        own = self._reused_rows(rows, shared, width - shared) if prefix is not None else None
        cache, attention = self._batch_cache(prefix, len(rows), width + hf_config.max_new_tokens, own)
        with attention:
            output = self.model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                                         cache=cache, generation_config=hf_config, **(extra or {}))
        new_tokens = output[:, width:].tolist()
        if prefix is not None:
            self._keep_rows(rows, shared, width - shared, new_tokens, cache)
        return new_tokens

    # -----------------------------------------------------------------------------------------------
    # Rows' own keys and values, kept from one turn to the next

    def _reused_rows(self, rows: list[list[int]], shared: int,
                     own_width: int) -> list[tuple[Any, Any]] | None:
        """Per layer, the keys and values of the first columns of each row's own part (after the shared
        prefix) that an earlier batch already computed for the same tokens, laid out as
        ``prefix_layout`` lays the batch out (padding columns zero; attention masks them); None when no
        row has anything to reuse.

        An agent's next turn is its last prompt plus the reply and the tool's answer: without this, every
        turn ran each row's whole conversation past the shared prefix through the model again. A token's
        keys and values depend only on the tokens before it and its position (the row index, positions
        coming from the attention mask), so a stored row that starts with the same tokens gives them
        exactly. The window still computed is the same for every row (the last ``own_width - kept``
        columns) and holds each row's last token, whose logits start generation.
        """
        import torch

        weights, routing = self._weights_state(), self._routing_state()
        self._rows = [r for r in self._rows if r.state == weights]  # stale after any weight change
        reuse: list[tuple[_StoredRow, int] | None] = []
        for row in rows:
            best, matched = None, 0
            for stored in self._rows:
                if stored.routing != routing or stored.shared > shared:
                    continue
                common = len(os.path.commonprefix([stored.tokens, row]))
                if common > matched:
                    best, matched = stored, common
            # Own tokens reusable: within the stored row, and never the row's last token.
            count = min(matched, len(row) - 1) - shared
            reuse.append((best, count) if best is not None and count > 0 else None)
        lengths = [len(row) - shared for row in rows]
        window = max(length - (r[1] if r else 0) for length, r in zip(lengths, reuse, strict=True))
        kept = own_width - window  # columns of the own part filled from stored rows
        if kept <= 0:
            return None
        layers = []
        for layer in range(len(next(r for r in reuse if r is not None)[0].layers)):
            sample = next(r for r in reuse if r is not None)[0].layers[layer][0]
            keys = sample.new_zeros((len(rows), sample.shape[1], kept, sample.shape[-1]))
            values = torch.zeros_like(keys)
            for i, (length, found) in enumerate(zip(lengths, reuse, strict=True)):
                start = own_width - length  # the row's first own column
                take = kept - start  # own tokens of this row within the kept columns
                if take <= 0:
                    continue
                assert found is not None  # window >= length - count, so take <= count
                stored, _count = found
                offset = shared - stored.shared
                k, v = stored.layers[layer]
                keys[i, :, start:kept] = k[0, :, offset:offset + take]
                values[i, :, start:kept] = v[0, :, offset:offset + take]
            layers.append((keys, values))
        return layers

    def _keep_rows(self, rows: list[list[int]], shared: int, own_width: int, new_tokens: list[list[int]],
                   cache: Any) -> None:
        """Store each row's own keys and values after generation (its prompt past the prefix and its reply
        up to end of turn, as far as the cache holds them) for the next turn to reuse; rows this batch
        continued are dropped, and at most ``2 * batch_size`` rows are kept (oldest go first)."""
        pad = self.tokenizer.pad_token_id
        ends = self._eos_ids() | ({pad} if pad is not None else set())
        weights, routing = self._weights_state(), self._routing_state()
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        behind = 0 if hasattr(cache.layers[0], "prefix_keys") else shared  # a copied prefix leads each row
        steps = len(new_tokens[0]) if new_tokens else 0
        kept: list[_StoredRow] = []
        for i, (row, generated) in enumerate(zip(rows, new_tokens, strict=True)):
            end = next((j + 1 for j, token in enumerate(generated) if token in ends), len(generated))
            fed = min(end, steps - 1)  # the last generated token is never fed back: no keys for it
            start = own_width - (len(row) - shared)
            stop = own_width + fed
            own = [(k[i:i + 1, :, behind + start:behind + stop].clone(),
                    v[i:i + 1, :, behind + start:behind + stop].clone()) for k, v in layers]
            kept.append(_StoredRow(state=weights, routing=routing, shared=shared,
                                   tokens=list(row) + list(generated[:fed]), layers=own))
        continued = {id(r) for r in self._rows if any(
            len(r.tokens) <= len(row) and row[:len(r.tokens)] == r.tokens for row in rows)}
        self._rows = [r for r in self._rows if id(r) not in continued] + kept
        del self._rows[:max(0, len(self._rows) - 2 * self.batch_size)]

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

    def generate(self, conversations: list[list[dict[str, Any]]], tools: Tools = None,
                 config: GenerationConfig | None = None) -> list[str]:
        """One assistant text per conversation (see ``complete``)."""
        return [completion.text for completion in self.complete(conversations, tools, config)]


@dataclass
class _StoredRow:
    """One generated row past its batch's ``shared`` prefix: its tokens (prompt and reply) and per-layer
    keys/values (batch 1) of ``tokens[shared:]`` as far as computed, valid while the weights ``state``
    and ``routing`` hold."""

    state: tuple[Any, ...]
    routing: tuple[Any, ...]
    shared: int
    tokens: list[int]
    layers: list[tuple[Any, Any]]


@dataclass
class _StoredPrefix:
    """A shared prefix's tokens and per-layer keys/values (batch 1), valid while the weights ``state``
    holds."""

    state: tuple[Any, ...]
    tokens: list[int]
    layers: list[tuple[Any, Any]]
