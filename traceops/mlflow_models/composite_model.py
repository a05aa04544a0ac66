"""Pyfunc model (models from code) of a routed MoE-LoRA composite over its base model."""

from __future__ import annotations

import mlflow

from traceops.mlflow_models import ChatPyfunc
from traceops.model.adapted import load_composite_model


class CompositePyfunc(ChatPyfunc):
    """Base model + the logged ``save_moe`` folder (artifact ``composite``): experts and routers."""

    artifact_key = "composite"
    loader = staticmethod(load_composite_model)


mlflow.models.set_model(CompositePyfunc())
