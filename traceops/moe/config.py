"""``MoEConfig``: everything needed to rebuild a composite on a base model, JSON-serializable."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from traceops.errors import ConfigError
from traceops.moe.router import MODES

NULL_EXPERT = "null"
FORMAT_VERSION = 1


@dataclass
class MoEConfig:
    """Description of a stacked MoE-LoRA composite.

    ``experts`` are the expert names in stacking order; ``capabilities`` maps each to the capability it
    was trained for. ``ranks``/``alphas`` are each adapter's original LoRA rank and alpha (the stack is
    padded to ``rank``). ``modules`` are the wrapped linears' paths in the base model and ``blocks`` the
    decoder blocks that own a router, in layer order. ``base_model`` names the base the adapters were
    trained on; ``base_weights_hash`` pins its weights when the caller knows it.
    """

    experts: list[str]
    capabilities: dict[str, str]
    modules: list[str]
    blocks: list[str]
    target_modules: list[str]
    rank: int
    ranks: dict[str, int]
    alphas: dict[str, float]
    top_k: int = 2
    mode: str = "token"
    null_expert: bool = True
    hidden_size: int = 0
    base_model: str | None = None
    base_weights_hash: str | None = None
    router_seed: int = 0
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def num_experts(self) -> int:
        return len(self.experts)

    @property
    def expert_names(self) -> list[str]:
        """Names of the router's outputs: the experts, then ``null`` when there is a null expert."""
        return [*self.experts, NULL_EXPERT] if self.null_expert else list(self.experts)

    def validate(self) -> None:
        """Raise ``ConfigError`` on settings that cannot work."""
        if not self.experts:
            raise ConfigError("a MoE composite needs at least one expert adapter")
        if len(set(self.experts)) != len(self.experts):
            raise ConfigError(f"expert names must be unique, got {self.experts}")
        if NULL_EXPERT in self.experts:
            raise ConfigError(f"'{NULL_EXPERT}' is reserved for the base-only expert; rename that adapter")
        if self.mode not in MODES:
            raise ConfigError(f"routing mode must be one of {MODES}, got '{self.mode}'")
        choices = self.num_experts + int(self.null_expert)
        if not 1 <= self.top_k <= choices:
            raise ConfigError(f"top_k must be between 1 and {choices} (experts + null), got {self.top_k}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MoEConfig:
        """Inverse of ``to_dict``; unknown keys are an error (they mean a newer format)."""
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"MoE config has unknown fields {sorted(unknown)}; upgrade traceops to read it")
        version = data.get("format_version", FORMAT_VERSION)
        if version > FORMAT_VERSION:
            raise ConfigError(f"MoE config format {version} is newer than this traceops ({FORMAT_VERSION})")
        return cls(**data)
