"""The ``serve:`` section of params.yaml, validated (unknown keys and out-of-range values are errors)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from traceops.errors import ConfigError


@dataclass(frozen=True)
class ServeParams:
    """How the server batches, queues and follows the registry.

    ``poll_seconds``: how often the champion alias (and every followed alias) is checked; 0 turns polling
    off (``POST /v1/reload`` still swaps). ``queue_size``: requests waiting per model before new ones get
    503 with Retry-After. ``batch_window_ms``: how long the first request of a batch waits for others.
    ``max_batch``: requests generated together at most. ``log_traffic``: append every exchange under the
    home's data/raw/served/. ``redact``: regexes of secrets blanked in that log (None: the traffic
    log's defaults). ``max_loaded_models``: models held in memory at most (the default included); a
    request for another one unloads the least recently used idle one first (None: no cap).
    ``domain``: the domain served exchanges are logged under when the request names none (None: the
    served version's training domain, when it has exactly one).
    """

    poll_seconds: float = 30.0
    queue_size: int = 64
    batch_window_ms: float = 5.0
    max_batch: int = 8
    log_traffic: bool = True
    redact: tuple[str, ...] | None = None
    max_loaded_models: int | None = 4
    domain: str | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None, **overrides: Any) -> ServeParams:
        """Params from a ``params.yaml`` mapping, then ``overrides`` that are not None (CLI options)."""
        values = {**dict(params or {}), **{k: v for k, v in overrides.items() if v is not None}}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"params.yaml serve: unknown key(s) {unknown}; known: {sorted(known)}")
        flag = values.get("log_traffic", cls.log_traffic)
        if not isinstance(flag, bool):
            raise ConfigError(f"params.yaml serve.log_traffic is {flag!r}; use true or false")
        redact = values.get("redact")
        if redact is not None and (not isinstance(redact, (list, tuple))
                                   or not all(isinstance(r, str) for r in redact)):
            raise ConfigError(f"params.yaml serve.redact is {redact!r}; use a list of regexes, or null "
                              "for the traffic log's defaults")
        domain = values.get("domain")
        if domain is not None and (not isinstance(domain, str) or not domain.strip()):
            raise ConfigError(f"params.yaml serve.domain is {domain!r}; use a domain name such as retail, "
                              "or null")
        cap = values.get("max_loaded_models", cls.max_loaded_models)
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ConfigError(f"params.yaml serve.max_loaded_models is {cap!r}; use a whole number of at "
                              "least 1 (the default model counts), or null for no cap")
        try:
            params_ = cls(poll_seconds=float(values.get("poll_seconds", cls.poll_seconds)),
                          queue_size=int(values.get("queue_size", cls.queue_size)),
                          batch_window_ms=float(values.get("batch_window_ms", cls.batch_window_ms)),
                          max_batch=int(values.get("max_batch", cls.max_batch)),
                          log_traffic=flag, redact=tuple(redact) if redact is not None else None,
                          max_loaded_models=cap, domain=domain.strip() if domain else None)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"params.yaml serve: {exc}; poll_seconds and batch_window_ms are numbers, "
                              "queue_size and max_batch whole numbers") from exc
        for name in ("queue_size", "max_batch"):
            if getattr(params_, name) < 1:
                raise ConfigError(f"params.yaml serve.{name} is {getattr(params_, name)}; use at least 1")
        for name in ("poll_seconds", "batch_window_ms"):
            if getattr(params_, name) < 0:
                raise ConfigError(f"params.yaml serve.{name} is {getattr(params_, name)}; use 0 or more")
        return params_
