"""``RouteConfig``: every setting of the route stage with its default, help text and validation, in the
style of TRL's configs. It is the one home of the route defaults: params.yaml's ``route`` section and a
run's overrides replace only what they name (``RouteConfig.from_params``).

The defaults are the nightly's, sized for a CPU night. A request-mode composite decides from a base-only
pass over the prompt, so the fit is a probe phase alone: one base-routing forward pass over 6 train
demonstrations per capability (each batch's shared system prompt and tools run once), linear probes fit
on their block inputs and decision prompts, no optimizer steps through the composite. On the measured
retail night's 5 adapters this routed 136 of 136 val decision prompts to their own expert, where the
earlier defaults (16 demonstrations, both routings, 8 optimizer steps: 283 s, 57 reference steps) routed
107 of 136 (the optimizer steps lowered held-out decision accuracy from 1.0 to 0.84 on that night).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from types import NoneType
from typing import Any, get_args, get_type_hints

from traceops.errors import ConfigError
from traceops.moe.fit import FitConfig
from traceops.moe.probe import ROUTINGS
from traceops.moe.router import MODES

# The fit settings a route run chooses: FitConfig's fields without a default (the others are the fitter's
# internals), each a RouteConfig field of the same name.
_FIT_FIELDS = tuple(spec.name for spec in fields(FitConfig) if spec.default is MISSING)


@dataclass(frozen=True)
class RouteConfig:
    """Settings of the route stage: the composite's routing, the router fit and the demonstrations.

    Each field's ``metadata["help"]`` says what it does; ``ge``/``gt``/``le``/``lt`` and ``choices`` in the
    metadata are the bounds ``__post_init__`` enforces.
    """

    top_k: int = field(default=1, metadata={
        "help": "Experts per token (request mode: per request), the null expert included in the choice. On "
                "the sample night's composite request top-1 scored 65% test success, top-2 30%.",
        "ge": 1})
    mode: str = field(default="request", metadata={
        "help": "request: one routing decision per request, from a base-only pass over the prompt "
                "(TRACE-style); token: every token is routed. request measured better on the sample night "
                "(test success 50% vs 35%).",
        "choices": MODES})
    seed: int = field(default=0, metadata={
        "help": "Seeds the demonstration samples, the routers' init, the held-out split, the batch order and "
                "the router updates."})
    null_expert: bool = field(default=True, metadata={
        "help": "Give the router a base-only choice (no adapter) it may pick."})
    steps: int = field(default=0, metadata={
        "help": "Router optimizer steps through the routed composite after the probe phase (0: the probe "
                "alone). On the measured retail night 8 steps cost about 40 s and lowered held-out "
                "request-mode decision accuracy from 1.0 to 0.84.",
        "ge": 0})
    batch_size: int = field(default=4, metadata={
        "help": "Demonstrations per optimizer step and per routing pass.", "ge": 1})
    max_length: int = field(default=256, metadata={
        "help": "Tokens per demonstration in the optimizer steps and the val routing trace (the tail: the "
                "answer and the prompt's end).",
        "ge": 1})
    learning_rate: float = field(default=2e-2, metadata={
        "help": "AdamW learning rate of the optimizer steps.", "gt": 0})
    route_weight: float = field(default=1.0, metadata={
        "help": "Weight of the supervised routing loss (capability c's tokens go to expert c).", "ge": 0})
    lm_weight: float = field(default=1.0, metadata={
        "help": "Weight of the LM loss on the demonstrations' assistant turns.", "ge": 0})
    balance_weight: float = field(default=0.01, metadata={
        "help": "Weight of the Switch load-balancing loss.", "ge": 0})
    z_weight: float = field(default=1e-3, metadata={"help": "Weight of the router z-loss.", "ge": 0})
    probe_steps: int = field(default=200, metadata={
        "help": "Probe phase before the optimizer steps: full-batch Adam steps per router, fit as a linear "
                "probe on the block inputs of whole demonstrations under teacher-forced routing (0: none).",
        "ge": 0})
    probe_tokens: int = field(default=64, metadata={
        "help": "Block inputs the probe samples per demonstration and forced routing.", "ge": 1})
    probe_max_length: int = field(default=2048, metadata={
        "help": "Tokens of a demonstration the probe reads (whole conversations here; the tail beyond).",
        "ge": 1})
    decision_weight: float = field(default=1.0, metadata={
        "help": "Weight of the request-mode decision loss on the demonstrations' whole prompts (0: "
                "token-level supervision only).",
        "ge": 0})
    train_examples: int | None = field(default=8, metadata={
        "help": "Demonstrations per capability drawn from the train split, a seeded sample (null: all); "
                "heldout_fraction of them measure the fit. 8 (6 fitted) routed every val decision prompt "
                "of the measured retail night's 5 capabilities to its expert.",
        "ge": 1})
    heldout_fraction: float = field(default=0.2, metadata={
        "help": "Share of the train demonstrations held out to measure routing accuracy.", "ge": 0, "lt": 1})
    val_examples: int = field(default=4, metadata={
        "help": "Demonstrations per capability from the val split for the routing trace (0: no trace).",
        "ge": 0})

    keep_base: bool = field(default=True, metadata={
        "help": "Teach the routers when the base should answer: the base model's own logged requests on "
                "the train side of the held-out split, its successes targeting the null expert and its "
                "failures the expert of the capability the diagnosis blamed. Kept only when held-out ones "
                "route right (keep_base_min_recall); a one-capability composite then gets a router too. "
                "Only runs logged by the base model count (agent = its id): another agent's successes "
                "say nothing of what the base does. Needs the null expert and a probe phase (without "
                "them it does nothing). On the BFCL night it raised the composite from 20/83 held-out "
                "requests (the adapter alone) to 30/83 (base 16/83); on the retail sample the base "
                "logged 4 successes, too few: nothing is fitted."})
    keep_base_examples: int = field(default=256, metadata={
        "help": "Logged requests per target (the null expert, each capability) drawn for keep-base "
                "routing, a seeded sample; heldout_fraction of them measure it. On the BFCL logs 64 per "
                "target routed 9/13 held-out successes to the base, all 84 train-side ones 12/15 of the "
                "real held-out requests' (each prompt costs a base forward pass, ~0.8 s on 2 cores).",
        "ge": 2})
    keep_base_min_recall: float = field(default=0.7, metadata={
        "help": "Keep-base routing is kept only when at least this share of the held-out logged prompts "
                "of every target, and of the demonstrations' held-out decision prompts, route right. On "
                "the BFCL logs five seeded 80/20 splits of the train side measured the base's successes "
                "at 0.70-0.94 (0.80-0.87 on the real held-out requests): 0.8 would reject a router that "
                "works about half the time; indistinguishable prompts score near 0.5.",
        "ge": 0, "le": 1})

    def __post_init__(self) -> None:
        for spec in fields(self):
            problem = _problem(spec, getattr(self, spec.name))
            if problem:
                raise ConfigError(f"route.{spec.name} {problem}")
        try:
            self.fit_config()  # the fitter's own checks (steps and probe_steps not both 0)
        except ConfigError as exc:
            raise ConfigError(f"route: {exc}") from exc

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | None = None,
                    *, top_k: int | None = None, mode: str | None = None) -> RouteConfig:
        """The settings of one run: these defaults < ``params`` (params.yaml's ``route`` section; empty
        keeps every default) < ``overrides`` < an explicit ``top_k``/``mode``. An unknown key is a
        ConfigError that lists the known ones."""
        known = [spec.name for spec in fields(cls)]
        values: dict[str, Any] = {}
        for source, given in (("params.yaml route", params or {}), ("overrides", overrides or {})):
            unknown = sorted(set(given) - set(known))
            if unknown:
                raise ConfigError(f"{source}: unknown route parameter(s) {', '.join(unknown)}; known: "
                                  f"{', '.join(sorted(known))}")
            values.update(given)
        if top_k is not None:
            values["top_k"] = top_k
        if mode is not None:
            values["mode"] = mode
        return cls(**values)

    @property
    def keeps_base(self) -> bool:
        """Whether this run fits keep-base routing: asked for, with a null expert to keep the base with
        and a probe phase to fit and check it in."""
        return self.keep_base and self.null_expert and self.probe_steps > 0

    def to_dict(self) -> dict[str, Any]:
        """Every setting by name: the stage's MLflow params and part of its cache key."""
        return asdict(self)

    def fit_config(self) -> FitConfig:
        """The router fit's settings (``fit_router``). A request-mode composite decides from a base-only
        pass over the prompt, so its probes read block inputs under base routing alone: the states under
        each expert (a token-mode composite's) would cost a second forward pass of every demonstration
        for inputs its routers never see."""
        routings = ("base",) if self.mode == "request" else ROUTINGS
        return FitConfig(**{name: getattr(self, name) for name in _FIT_FIELDS}, probe_routings=routings)


def _problem(spec: Field[Any], value: Any) -> str | None:
    """What is wrong with one setting's value, ending with what to send instead; None when it is valid."""
    hint, meta = _HINTS[spec.name], spec.metadata
    kinds = [kind for kind in get_args(hint) if kind is not NoneType] or [hint]
    if value is None and NoneType in get_args(hint):
        return None
    kind, example = kinds[0], spec.default
    if kind is bool:
        return None if isinstance(value, bool) else f"must be true or false, got {value!r}"
    if kind is str:
        choices = meta.get("choices", ())
        return None if value in choices else f"must be one of {', '.join(choices)}, got {value!r}"
    numeric = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, numeric) or not math.isfinite(value):
        # PyYAML reads an exponent without a dot (2e-2) as a string.
        hint_text = " (YAML reads 2e-2 as text: write 2.0e-2 or 0.02)" if isinstance(value, str) else ""
        return (f"must be {'an integer' if kind is int else 'a number'}, got {value!r}{hint_text}; "
                f"send e.g. {example}")
    if "ge" in meta and value < meta["ge"]:
        return f"must be at least {meta['ge']}, got {value}; send e.g. {example}"
    if "gt" in meta and value <= meta["gt"]:
        return f"must be above {meta['gt']}, got {value}; send e.g. {example}"
    if "le" in meta and value > meta["le"]:
        return f"must be at most {meta['le']}, got {value}; send e.g. {example}"
    if "lt" in meta and value >= meta["lt"]:
        return f"must be below {meta['lt']}, got {value}; send e.g. {example}"
    return None


_HINTS = get_type_hints(RouteConfig)
