"""Save and load a composite: ``moe_config.json`` plus ``moe_model.safetensors`` (routers and stacked
experts). Never pickle: the folder is plain JSON and safetensors, loadable without running code."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from traceops.errors import ConfigError, InputError
from traceops.moe.config import MoEConfig
from traceops.moe.model import MoEModel

CONFIG_NAME = "moe_config.json"
WEIGHTS_NAME = "moe_model.safetensors"


def moe_state(moe: MoEModel) -> dict[str, torch.Tensor]:
    """The composite's own tensors: ``router.<block>.weight``, ``expert.<module>.A [E, r, in]`` and
    ``expert.<module>.B [E, out, r]`` (scaling folded into B)."""
    tensors: dict[str, torch.Tensor] = {}
    for path, router in moe.routers.items():
        tensors[f"router.{path}.weight"] = router.proj.weight.detach()
    for path, layer in moe.layers.items():
        a, b = layer.stacked()
        tensors[f"expert.{path}.A"] = a.detach()
        tensors[f"expert.{path}.B"] = b.detach()
    return {k: v.cpu().contiguous() for k, v in tensors.items()}


def save_moe(moe: MoEModel, folder: str | Path) -> Path:
    """Write the composite (not the base model) into ``folder``; returns the folder."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    save_file(moe_state(moe), str(root / WEIGHTS_NAME), metadata={"format": "traceops-moe-lora"})
    (root / CONFIG_NAME).write_text(json.dumps(moe.config.to_dict(), indent=2, sort_keys=True) + "\n")
    return root


def read_config(folder: str | Path) -> MoEConfig:
    """The ``MoEConfig`` saved in a composite folder."""
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise InputError("missing; is this a folder written by save_moe?", file=str(path))
    try:
        return MoEConfig.from_dict(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON ({exc})", file=str(path)) from exc


def load_moe(base_model: nn.Module, folder: str | Path) -> MoEModel:
    """Wrap ``base_model`` (in place) with the composite saved in ``folder``: experts and fitted routers."""
    root = Path(folder)
    config = read_config(root)
    weights_file = root / WEIGHTS_NAME
    if not weights_file.is_file():
        raise InputError("missing; the composite folder is incomplete", file=str(weights_file))
    tensors = load_file(str(weights_file))
    experts: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for path in config.modules:
        try:
            experts[path] = (tensors[f"expert.{path}.A"], tensors[f"expert.{path}.B"])
        except KeyError as exc:
            raise InputError(f"has no weights for module '{path}'", file=str(weights_file)) from exc
    try:
        moe = MoEModel.wrap(base_model, config, experts)
    except AttributeError as exc:
        raise ConfigError(f"{root}: the base model lacks a module the composite wraps ({exc}); load the "
                          f"base model '{config.base_model}' it was built on") from exc
    for path, router in moe.routers.items():
        key = f"router.{path}.weight"
        if key not in tensors or tensors[key].shape != router.proj.weight.shape:
            raise InputError(f"router weight '{key}' is missing or has the wrong shape",
                             file=str(weights_file))
        with torch.no_grad():
            router.proj.weight.copy_(tensors[key])
    return moe
