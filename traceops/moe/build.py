"""Build a ``MoEModel`` from PEFT LoRA adapter folders (``adapter_config.json`` +
``adapter_model.safetensors``), read with json and safetensors only (never ``torch.load``)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from traceops.errors import ConfigError, InputError
from traceops.moe.config import MoEConfig
from traceops.moe.model import MoEModel, block_path

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."
# PEFT saves ``<module>.lora_A.weight``; some versions keep the adapter name: ``lora_A.<name>.weight``.
_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight$")


@dataclass
class LoraAdapter:
    """One PEFT LoRA adapter: per module path (in the base model), ``A [r, in]``, ``B [out, r]`` and the
    scaling PEFT applies (``alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA)."""

    name: str
    folder: Path
    config: dict
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]
    scaling: dict[str, float]

    @property
    def rank(self) -> int:
        return max(a.shape[0] for a, _ in self.weights.values())

    @property
    def base_model(self) -> str | None:
        return self.config.get("base_model_name_or_path") or None

    @property
    def target_modules(self) -> list[str]:
        return sorted({path.rsplit(".", 1)[-1] for path in self.weights})


def _pattern_value(patterns: dict, module: str, default: float) -> float:
    # PEFT's rule (peft.utils.other.get_pattern_key): a key matches the module path's tail.
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return float(value)
    return float(default)


def read_adapter(name: str, folder: str | Path) -> LoraAdapter:
    """Read and check one PEFT LoRA adapter folder."""
    root = Path(folder)
    config_file, weights_file = root / ADAPTER_CONFIG, root / ADAPTER_WEIGHTS
    for needed in (config_file, weights_file):
        if not needed.is_file():
            raise InputError(f"missing; save the adapter with PEFT's save_pretrained "
                             f"(safe_serialization) so it has {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}",
                             file=str(needed))
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON ({exc})", file=str(config_file)) from exc
    if config.get("peft_type", "LORA") != "LORA":
        raise InputError(f"is a {config.get('peft_type')} adapter; only LoRA adapters can be experts",
                         file=str(config_file), field="peft_type")
    unsupported = {"use_dora": False, "fan_in_fan_out": False, "lora_bias": False}
    for key, expected in unsupported.items():
        if bool(config.get(key, expected)) != expected:
            raise InputError(f"{key}={config.get(key)} is not supported by the stacked MoE-LoRA; retrain "
                             f"the adapter with {key}={expected}", file=str(config_file), field=key)
    if config.get("bias", "none") != "none":
        raise InputError("adapters that train biases are not supported; retrain with bias='none'",
                         file=str(config_file), field="bias")
    if config.get("modules_to_save"):
        raise InputError("modules_to_save replaces whole modules, which cannot be mixed per token; "
                         "retrain without it", file=str(config_file), field="modules_to_save")
    tensors = load_file(str(weights_file))
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise InputError(f"tensor '{key}' is not a LoRA A/B weight of a linear layer; only linear "
                             "LoRA adapters can be experts", file=str(weights_file), field=key)
        module = match["module"].removeprefix(_PEFT_PREFIX)
        parts.setdefault(module, {})[match["which"]] = tensor
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    scaling: dict[str, float] = {}
    use_rslora = bool(config.get("use_rslora", False))
    for module, pair in sorted(parts.items()):
        if set(pair) != {"A", "B"}:
            raise InputError(f"module '{module}' has only lora_{''.join(pair)}; the file is incomplete",
                             file=str(weights_file))
        a, b = pair["A"].float(), pair["B"].float()
        if a.shape[0] != b.shape[1]:
            raise InputError(f"module '{module}': lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} "
                             "disagree on the rank", file=str(weights_file))
        rank = a.shape[0]
        alpha = _pattern_value(config.get("alpha_pattern") or {}, module, config.get("lora_alpha", rank))
        weights[module] = (a, b)
        scaling[module] = alpha / math.sqrt(rank) if use_rslora else alpha / rank
    if not weights:
        raise InputError("holds no LoRA weights", file=str(weights_file))
    return LoraAdapter(name=name, folder=root, config=config, weights=weights, scaling=scaling)


def check_compatible(adapters: list[LoraAdapter]) -> None:
    """All adapters must share the base model and wrap the same modules."""
    bases = {a.name: a.base_model for a in adapters if a.base_model}
    if len(set(bases.values())) > 1:
        raise ConfigError(f"adapters were trained on different base models: {bases}; "
                          "MoE-LoRA experts must share one base")
    reference = adapters[0]
    for adapter in adapters[1:]:
        if set(adapter.weights) != set(reference.weights):
            extra = sorted(set(adapter.weights) - set(reference.weights))[:3]
            missing = sorted(set(reference.weights) - set(adapter.weights))[:3]
            raise ConfigError(
                f"adapter '{adapter.name}' ({adapter.folder}) targets different modules than "
                f"'{reference.name}' (extra e.g. {extra}, missing e.g. {missing}); train every capability "
                "adapter with the same target_modules"
            )


def stack_experts(adapters: list[LoraAdapter]) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], int]:
    """Per module: ``A [E, r, in]`` and scaled ``B [E, out, r]``, ranks zero-padded to the max rank."""
    rank = max(a.rank for a in adapters)
    stacked: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for module in sorted(adapters[0].weights):
        a_list, b_list = [], []
        for adapter in adapters:
            a, b = adapter.weights[module]
            pad = rank - a.shape[0]
            # Zero rows of A and zero columns of B add nothing: padding keeps outputs exact.
            a_list.append(torch.nn.functional.pad(a, (0, 0, 0, pad)))
            b_list.append(torch.nn.functional.pad(b * adapter.scaling[module], (0, pad)))
        stacked[module] = (torch.stack(a_list), torch.stack(b_list))
    return stacked, rank


def build_moe(base_model: nn.Module, adapter_dirs: dict[str, Path], top_k: int = 2, null_expert: bool = True,
              mode: str = "token", capabilities: dict[str, str] | None = None, router_seed: int = 0,
              base_weights_hash: str | None = None) -> MoEModel:
    """Wrap ``base_model`` (in place) with the adapters in ``adapter_dirs`` (expert name -> folder).

    ``capabilities`` maps expert names to capability ids (default: the name itself). Routers start
    from a seeded near-uniform init; fit them with ``traceops.moe.fit.fit_router``.
    """
    if not adapter_dirs:
        raise ConfigError("build_moe needs at least one adapter folder")
    adapters = [read_adapter(name, folder) for name, folder in adapter_dirs.items()]
    check_compatible(adapters)
    stacked, rank = stack_experts(adapters)
    for module, (a, b) in stacked.items():
        try:
            target = base_model.get_submodule(module)
        except AttributeError as exc:
            raise ConfigError(f"the base model has no module '{module}' that the adapters target; "
                              "load the base model the adapters were trained on") from exc
        if not isinstance(target, nn.Linear) or (target.in_features, target.out_features) != (
                a.shape[2], b.shape[1]):
            raise ConfigError(f"module '{module}' of the base model does not match the adapters' shapes "
                              f"(A {tuple(a.shape)}, B {tuple(b.shape)}); wrong base model")
    modules = sorted(stacked)
    blocks = sorted({block_path(m) for m in modules}, key=_natural_key)
    names = [a.name for a in adapters]
    base_ref = next((a.base_model for a in adapters if a.base_model), None) or getattr(
        getattr(base_model, "config", None), "name_or_path", None) or None
    config = MoEConfig(
        experts=names,
        capabilities={n: (capabilities or {}).get(n, n) for n in names},
        modules=modules,
        blocks=blocks,
        target_modules=adapters[0].target_modules,
        rank=rank,
        ranks={a.name: a.rank for a in adapters},
        alphas={a.name: float(a.config.get("lora_alpha", a.rank)) for a in adapters},
        top_k=top_k,
        mode=mode,
        null_expert=null_expert,
        base_model=base_ref,
        base_weights_hash=base_weights_hash,
        router_seed=router_seed,
    )
    return MoEModel.wrap(base_model, config, stacked)


def _natural_key(path: str) -> list[object]:
    return [int(p) if p.isdigit() else p for p in path.split(".")]
