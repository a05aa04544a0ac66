"""Pyfunc model (models from code) of one capability's PEFT adapter over its base model."""

from __future__ import annotations

import mlflow

from traceops.mlflow_models import ChatPyfunc
from traceops.model.adapted import load_adapter_model


class AdapterPyfunc(ChatPyfunc):
    """Base model + the logged PEFT adapter (artifact ``adapter``)."""

    artifact_key = "adapter"
    loader = staticmethod(load_adapter_model)


mlflow.models.set_model(AdapterPyfunc())
