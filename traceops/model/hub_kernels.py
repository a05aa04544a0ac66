"""Hugging Face Hub kernels stay off unless asked for.

transformers (5.25 here) with the ``kernels`` package installed swaps layers for kernels it downloads from
the Hub when a model is loaded on a GPU or put in training mode. That needs the network (offline it
fails: "could not verify publisher trust status") and runs code fetched at load time, so traceops loads
every model with them off. ``USE_HUB_KERNELS=YES`` in the environment turns transformers' default back on.
"""

from __future__ import annotations

import os

ENV = "USE_HUB_KERNELS"
_TRUE = {"1", "ON", "YES", "TRUE"}


def kernel_kwargs() -> dict[str, bool]:
    """``from_pretrained`` keyword arguments: ``use_kernels=False`` unless ``USE_HUB_KERNELS`` opts in."""
    return {} if os.environ.get(ENV, "").strip().upper() in _TRUE else {"use_kernels": False}
