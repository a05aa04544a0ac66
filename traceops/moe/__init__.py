"""Stacked MoE-LoRA: capability adapters mixed per token by a small router over a frozen base.

``build_moe`` wraps a base model with PEFT adapter folders, ``fit_router`` trains the routers,
``save_moe``/``load_moe`` persist the composite, ``MoEModel.trace`` records routing for MLflow;
``traceops.compose`` does all of it for the route stage under one ``RouteConfig``.
"""

from traceops.moe.build import build_moe, read_adapter
from traceops.moe.config import NULL_EXPERT, MoEConfig
from traceops.moe.fit import FitConfig, FitResult, evaluate_routing, fit_router
from traceops.moe.io import load_moe, read_config, save_moe
from traceops.moe.layer import MoELoRALinear
from traceops.moe.model import MoEModel
from traceops.moe.route_config import RouteConfig
from traceops.moe.router import BlockRouter, RoutingState, topk_gate
from traceops.moe.trace import RoutingTrace

__all__ = [
    "NULL_EXPERT",
    "BlockRouter",
    "FitConfig",
    "FitResult",
    "MoEConfig",
    "MoELoRALinear",
    "MoEModel",
    "RouteConfig",
    "RoutingState",
    "RoutingTrace",
    "build_moe",
    "evaluate_routing",
    "fit_router",
    "load_moe",
    "read_adapter",
    "read_config",
    "save_moe",
    "topk_gate",
]
