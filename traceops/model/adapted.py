"""ChatModels over trained weights (base + PEFT adapter, base + MoE-LoRA composite, or the base alone),
prompting exactly as training did.

Training (``traceops.train``) renders every conversation with TRL's Qwen2.5 chat template (saved into
each adapter folder), opens it with ``envs.export.system_prompt(env)`` (the environment's prompt or the
generic tool-use one) and writes each assistant turn as its text followed by
``<tool_call>{json}</tool_call>`` lines, with tool results as plain ``tool`` messages. The agent loop
keeps structured history instead: assistant ``tool_calls``, tool messages with names and call ids, and
no system message when the environment has none; the Qwen2.5 template would render those calls with
extra newlines the adapters never saw. ``training_conversation`` maps the agent's history onto the
training form, so the token ids an adapter is prompted with at evaluation equal the ones it was trained
on (tests/test_model_adapted.py checks this against ``train.sft.assistant_mask``).

The base model is evaluated the same way (``load_base_model``): same template, same history form, so
base, adapters, generic LoRA and composite are compared on identical prompts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traceops.errors import ModelError
from traceops.hashing import content_hash
from traceops.model.base import (
    Completion,
    GenerationConfig,
    ModelInfo,
    Tools,
    pick_tools,
    tools_per_conversation,
)
from traceops.model.chat_template import DEFAULT_SYSTEM_PROMPT, trained_tokenizer
from traceops.model.embedded import read_manifest, safetensors_hash
from traceops.model.hub_kernels import kernel_kwargs
from traceops.model.local import LocalChatModel
from traceops.model.toolcalls import chat_assistant_text, messages_to_chat, render_prompt


def training_conversation(messages: list[Any]) -> list[dict[str, str]]:
    """An agent-loop conversation (schema Messages or OpenAI dicts) in the form training renders.

    System, user and tool messages keep only role and content; an assistant message becomes its
    stripped text followed by its calls in canonical ``<tool_call>`` form (``train.data.turn_text``);
    a conversation without a system message gets ``DEFAULT_SYSTEM_PROMPT``, as
    ``envs.export.system_prompt`` gives environments without one.
    """
    out: list[dict[str, str]] = []
    for message in messages_to_chat(messages):
        role = message["role"]
        content = message.get("content") or ""
        if role == "assistant":
            content = chat_assistant_text(message)
        out.append({"role": role, "content": content})
    if not out or out[0]["role"] != "system":
        out.insert(0, {"role": "system", "content": DEFAULT_SYSTEM_PROMPT})
    return out


class TrainedChatModel(LocalChatModel):
    """A ``LocalChatModel`` that renders conversations the way training did (``training_conversation``).

    Built with ``from_objects`` by the loaders below; ``composite`` holds the ``MoEModel`` wrapper of a
    composite (its routers and hooks live on ``model``), else None.
    """

    composite: Any = None
    _decider: Any = None  # the composite's RequestDecider, made on first use

    def prompt(self, conversation: list[Any], tools: list[Any] | None = None) -> str:
        """The exact prompt text generation starts from for ``conversation``."""
        return render_prompt(self.tokenizer, training_conversation(conversation), tools)

    def prompt_ids(self, conversation: list[Any], tools: list[Any] | None = None) -> list[int]:
        """The token ids of ``prompt`` as ``complete`` tokenizes them (no added special tokens)."""
        return list(self.tokenizer(self.prompt(conversation, tools), add_special_tokens=False)["input_ids"])

    def complete(self, conversations: list[list[dict[str, Any]]], tools: Tools = None,
                 config: GenerationConfig | None = None) -> list[Completion]:
        """``LocalChatModel.complete`` over the training form of each conversation.

        A request-mode composite with the prefix cache on first decides every conversation's route,
        then generates each group of equal decisions under that fixed gate (``_complete_by_route``):
        the same greedy tokens as letting each batch's prefill decide, with the shared prefix computed
        once per route instead of once per row and turn. Sampled output depends on the grouping (each
        group is its own batch, seeded as ``complete`` seeds batches).
        """
        chats = [training_conversation(c) for c in conversations]
        moe = self.composite
        if (moe is not None and moe.mode == "request" and moe.state.forced is None and self.prefix_cache
                and self._supports_prefix_cache()):
            return self._complete_by_route(chats, tools, config)
        return super().complete(chats, tools, config)

    def _routing_state(self) -> tuple[Any, ...]:
        """A composite's prefix keys and values depend on its mode, top-k and forced gate too."""
        moe = self.composite
        if moe is None:
            return ()
        forced = moe.state.forced
        return (moe.mode, moe.top_k, None if forced is None else tuple(forced.flatten().tolist()))

    def _complete_by_route(self, chats: list[list[dict[str, str]]], tools: Tools,
                           config: GenerationConfig | None) -> list[Completion]:
        """Request-mode completions generated route by route (see ``complete``). Decisions are made on
        the batches ``complete`` would form, so each row gets the gate its own batch's prefill gives."""
        import torch

        from traceops.model.request_routing import RequestDecider

        moe = self.composite
        if self._decider is None or self._decider.moe is not moe:
            self._decider = RequestDecider(self, moe)
        experts = moe.config.num_experts
        gates: list[tuple[float, ...]] = []
        prompts = [render_prompt(self.tokenizer, chat, own)
                   for chat, own in zip(chats, tools_per_conversation(tools, len(chats)), strict=True)]
        rows = [list(ids) for ids in self.tokenizer(prompts, add_special_tokens=False)["input_ids"]]
        max_new_tokens = self._hf_generation_config(config or GenerationConfig()).max_new_tokens
        for batch in self.generation_batches(rows, max_new_tokens):
            # The real experts' weights; under ``forced`` the null expert gets the rest of 1, as decided.
            decided = self._decider.gates(rows[batch.start:batch.stop])
            gates += [tuple(row) for row in decided[:, :experts].tolist()]
        if moe.top_k > 1:
            # Mixes of several experts are continuous: rows rarely share one, and batch-1 groups would decode
            # slowly. Each batch generates under its rows' own gates, without the prefix cache.
            return self._complete_under_gates(chats, gates, tools, config)
        groups: dict[tuple[float, ...], list[int]] = {}
        for index, gate in enumerate(gates):
            groups.setdefault(gate, []).append(index)
        results: list[Completion | None] = [None] * len(chats)
        for gate, rows in groups.items():
            with moe.forced(torch.tensor(gate)):
                done = super().complete([chats[i] for i in rows], pick_tools(tools, rows), config)
            for index, completion in zip(rows, done, strict=True):
                results[index] = completion
        return [completion for completion in results if completion is not None]

    def _complete_under_gates(self, chats: list[list[dict[str, str]]], gates: list[tuple[float, ...]],
                              tools: Tools,
                              config: GenerationConfig | None) -> list[Completion]:
        """Batches of ``complete`` generated under their rows' forced gates, with the prefix cache off
        (a batch-1 prefix pass cannot carry per-row gates)."""
        import torch

        results: list[Completion] = []
        self.prefix_cache = False
        try:
            for start in range(0, len(chats), self.batch_size):
                rows = range(start, min(start + self.batch_size, len(chats)))
                with self.composite.forced(torch.tensor(gates[start:start + self.batch_size])):
                    results += super().complete(chats[start:start + self.batch_size], pick_tools(tools, rows),
                                                config)
        finally:
            self.prefix_cache = True
        return results


def _load_base(base_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    if not (base_model_dir / "config.json").is_file():
        raise ModelError(f"base model {base_model_dir}: no config.json; pass the folder the adapters were "
                         "trained on (resolve_base_model('embedded') gives the embedded one)")
    try:
        return AutoModelForCausalLM.from_pretrained(str(base_model_dir), dtype="float32",
                                                    use_safetensors=True, **kernel_kwargs())
    except Exception as exc:  # transformers raises many types; name the folder and the fix
        raise ModelError(f"{base_model_dir}: could not load the base model ({exc}); the folder needs "
                         "config.json and *.safetensors weights") from exc


def base_info(base_model_dir: Path) -> tuple[str, str]:
    """(model id, weights hash) of a base folder: its recorded manifest, else its folder name and the
    sha256 of its safetensors."""
    manifest = read_manifest(base_model_dir) or {}
    model_id = str(manifest.get("model_id") or base_model_dir.name)
    weights = str(manifest.get("weights_sha256") or safetensors_hash(base_model_dir))
    return model_id, weights


def load_base_model(base_model_dir: str | Path, batch_size: int = 8) -> TrainedChatModel:
    """The base model prompted exactly like the adapters (training template and history form): the
    baseline of a fair comparison."""
    base_dir = Path(base_model_dir)
    model = _load_base(base_dir)
    model_id, weights = base_info(base_dir)
    info = ModelInfo(model_id=model_id, weights_hash=weights,
                     extra={"backend": "local", "kind": "base", "base_model_dir": str(base_dir),
                            "chat_template": "trl/qwen2_5"})
    # Plain weights: the shared system + tools prefix is computed once and reused (exact, see LocalChatModel).
    return TrainedChatModel.from_objects(model, trained_tokenizer(base_dir, None), info, batch_size,
                                         prefix_cache=True)


def load_adapter_model(base_model_dir: str | Path, adapter_dir: str | Path, batch_size: int = 8,
                       merge: bool = True) -> TrainedChatModel:
    """The base model with the PEFT adapter in ``adapter_dir``, prompted as the adapter was trained.

    ``merge`` folds the LoRA into the base weights (same function, no adapter overhead per token).
    Raises ModelError when the folder is not a PEFT adapter or does not fit the base.
    """
    from peft import PeftModel

    base_dir, folder = Path(base_model_dir), Path(adapter_dir)
    if not (folder / "adapter_config.json").is_file() or not (folder / "adapter_model.safetensors").is_file():
        raise ModelError(f"{folder}: not a PEFT adapter folder (adapter_config.json + "
                         "adapter_model.safetensors); pass the adapter the train stage wrote or downloaded")
    base = _load_base(base_dir)
    try:
        model = PeftModel.from_pretrained(base, str(folder))
    except Exception as exc:  # peft raises KeyError/RuntimeError/ValueError on a mismatched base
        raise ModelError(f"{folder}: the adapter does not load onto base {base_dir} ({exc}); pass the base "
                         "model it was trained on") from exc
    if merge:
        model = model.merge_and_unload()
    model_id, weights = base_info(base_dir)
    adapter_hash = safetensors_hash(folder)
    info = ModelInfo(
        model_id=f"{model_id}+lora:{folder.name}",
        weights_hash=content_hash({"base": weights, "adapter": adapter_hash}, length=64),
        extra={"backend": "local", "kind": "adapter", "base_model_dir": str(base_dir),
               "adapter_dir": str(folder), "adapter_sha256": adapter_hash, "merged": merge},
    )
    return TrainedChatModel.from_objects(model, trained_tokenizer(base_dir, folder), info, batch_size,
                                         prefix_cache=merge)  # merged: plain weights again


def load_composite_model(base_model_dir: str | Path, composite_dir: str | Path,
                         batch_size: int = 8) -> TrainedChatModel:
    """The base model wrapped with the MoE-LoRA composite saved in ``composite_dir`` (``save_moe``):
    generation goes through HF ``generate`` with KV cache, routing per token (or per request, as the
    composite's config says)."""
    from traceops.moe.io import WEIGHTS_NAME, load_moe

    base_dir, folder = Path(base_model_dir), Path(composite_dir)
    base = _load_base(base_dir)
    moe = load_moe(base, folder)
    model_id, weights = base_info(base_dir)
    composite_hash = content_hash({"weights": safetensors_hash(folder),
                                   "config": moe.config.to_dict()}, length=64)
    info = ModelInfo(
        model_id=f"{model_id}+moe:{'+'.join(moe.config.experts)}",
        weights_hash=content_hash({"base": weights, "composite": composite_hash}, length=64),
        extra={"backend": "local", "kind": "composite", "base_model_dir": str(base_dir),
               "composite_dir": str(folder), "experts": list(moe.config.experts),
               "top_k": moe.config.top_k, "mode": moe.config.mode, "weights_file": WEIGHTS_NAME},
    )
    # The HF model itself carries the routed layers and hooks: generate through it directly. Token routing
    # reads each token's own block input, so a token's keys and values still depend on earlier tokens only
    # and the shared-prefix cache is exact. A request-mode decision pools the whole prompt: the chat model
    # decides first and generates each route's rows under that fixed gate, where the cache is exact again.
    chat = TrainedChatModel.from_objects(moe.model, trained_tokenizer(base_dir, folder), info, batch_size,
                                         prefix_cache=True)
    chat.composite = moe
    return chat
