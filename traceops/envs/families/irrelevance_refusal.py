"""irrelevance_refusal: recognise a request no API in the catalog can serve, and refuse without calling.

Level 1: an off-domain request (weather, poetry, trivia); level 2: an in-domain action no API offers;
level 3: a near miss that borrows a catalog API's verb for an object it does not handle. The verifier
wants a ``refuse`` call and no ``call_api`` attempt at all, so a silent agent earns nothing.

Native tasks (``traceops.envs.native``) offer the logged tools as they are, no ``refuse`` tool among
them: as in the logs, the right reply to a request no tool serves is one that calls nothing.
"""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar

from traceops.envs.apis import ApiCallEnv, api_view, catalog_text
from traceops.envs.base import AssistantTurn, Call
from traceops.envs.family import Family, opening, oracle_turns
from traceops.envs.grounding import CITIES, WORDS, Grounding, ValueFactory
from traceops.envs.native import no_call_task

CATALOG_SIZE = {1: 2, 2: 4, 3: 6}
OFF_DOMAIN = (
    "What will the weather be like in {city} on {day}?",
    "Write me a short poem about {word} and {word2}.",
    "What is {a} multiplied by {b}?",
    "Can you translate '{word} {word2}' into Japanese?",
    "Recommend a science fiction novel set in {city}.",
    "How long does it take to drive from {city} to {city2}?",
)
UNSUPPORTED_ACTIONS = (
    "merge my account with the one registered under {email}",
    "transfer ownership of my account to {email}",
    "delete my whole purchase history since {day}",
    "change the password of the account {email}",
    "open a new credit line of {a}00 dollars for me",
    "export all my data as a spreadsheet and mail it to {email}",
)
FOREIGN_OBJECTS = (
    "gym membership",
    "flight booking",
    "phone contract",
    "hotel reservation",
    "car insurance policy",
    "concert tickets",
)
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _fill(template: str, rng: random.Random, values: ValueFactory) -> str:
    """A request template with fresh, harmless details (so instances differ)."""
    return template.format(
        city=rng.choice(CITIES),
        city2=rng.choice(CITIES),
        day=rng.choice(DAYS),
        word=rng.choice(WORDS),
        word2=rng.choice(WORDS),
        a=rng.randint(12, 99),
        b=rng.randint(12, 99),
        email=values.fresh_email() if "{email}" in template else "",
    )


class IrrelevanceRefusalEnv(ApiCallEnv):
    """A catalog that cannot serve the request; ``refuse`` is the right move."""

    capability: ClassVar[str] = "irrelevance_refusal"
    _FREE_TEXT: ClassVar[frozenset[tuple[str, str]]] = frozenset({("refuse", "reason")})

    def reset(self, **task: Any) -> str:
        """Start an episode; returns the catalog and the user's request."""
        self._refused = False
        return super().reset(**task)

    def refuse(self, reason: str) -> str:
        """Decline the request because no available API can serve it.

        Args:
            reason: A short explanation for the user.
        """
        self._refused = True
        return "Refusal recorded."

    def get_reward(self) -> float:
        """1.0 when the agent refused and attempted no API call, else 0.0 (native: 1.0 for no call)."""
        if self._native:
            return super().get_reward()
        return 1.0 if self._refused and self._attempts == 0 else 0.0

    def oracle(self) -> list[AssistantTurn]:
        """Refuse, then tell the user (native: tell the user, calling nothing)."""
        if self._native:
            return super().oracle()
        reason = "None of the available APIs can do this."
        return oracle_turns(
            [{"name": "refuse", "arguments": {"reason": reason}}],
            f"Sorry, I can't help with that: {reason[0].lower()}{reason[1:]}",
        )

    def _extra_call(self, call: Call, rng: random.Random) -> Call | None:
        """The extra call a refusal must not make: an API call anyway."""
        api = rng.choice(sorted(self._apis))
        if self._native:
            return Call(api, {})
        return Call("call_api", {"name": api, "arguments": {}})

    def _effect_count(self) -> int:
        return int(getattr(self, "_refused", False)) + self._attempts


class IrrelevanceRefusalFamily(Family):
    """Curriculum from plainly off-domain to near-miss requests."""

    capability: ClassVar[str] = "irrelevance_refusal"
    env_class: ClassVar[type[ApiCallEnv]] = IrrelevanceRefusalEnv
    description: ClassVar[str] = "Refuse requests no available tool can serve, without calling any."

    def make_task(
        self, rng: random.Random, values: ValueFactory, grounding: Grounding, level: int
    ) -> dict[str, Any]:
        if grounding.interface == "native":
            return _native_task(rng, values, grounding, level)
        tools = [api_view(t) for t in grounding.tools]
        rng.shuffle(tools)
        catalog = sorted(tools[: CATALOG_SIZE[min(level, 3)]], key=lambda a: a["name"])
        if level == 1:
            request = _fill(rng.choice(OFF_DOMAIN), rng, values)
        elif level == 2:
            request = (
                f"{opening(rng, grounding)}Please {_fill(rng.choice(UNSUPPORTED_ACTIONS), rng, values)}."
            )
        else:
            verb = rng.choice(catalog)["name"].split("_")[0]
            request = (
                f"{opening(rng, grounding)}Please {verb} my {rng.choice(FOREIGN_OBJECTS)} for "
                f"{rng.choice(DAYS)} in {rng.choice(CITIES)}."
            )
        return {
            "apis": catalog,
            "gold": {"name": "refuse", "arguments": {}},
            "instruction": f"{catalog_text(catalog)}\n\nUser: {request}",
        }


def _native_task(rng: random.Random, values: ValueFactory, grounding: Grounding,
                 level: int) -> dict[str, Any]:
    """The logged tools offered natively and a request none of them serves (no opening from the logs:
    an unseen domain's first sentences are requests the tools do serve). A request whose topic words
    (weather, poem, multiplied, ...) occur in an offered tool's name or description is drawn again, so
    a domain whose tools do serve it (a calculator, a weather API) never gets it as a no-call task."""
    size = CATALOG_SIZE[min(level, 3)]
    task: dict[str, Any] = {}
    for _ in range(12):
        verb = ""
        if level == 1:
            request = _fill(rng.choice(OFF_DOMAIN), rng, values)
        elif level == 2:
            request = f"Please {_fill(rng.choice(UNSUPPORTED_ACTIONS), rng, values)}."
        else:  # a near miss: the borrowed verb is meant to match a tool, the object is not
            verb = rng.choice(list(grounding.tools))["name"].split("_")[0].split(".")[-1].lower()
            request = (f"Could you {verb} my {rng.choice(FOREIGN_OBJECTS)} for {rng.choice(DAYS)} in "
                       f"{rng.choice(CITIES)}?")
        task = no_call_task(rng, grounding, size, request)
        offered = " ".join(f"{t['function']['name']} {t['function'].get('description', '')}"
                           for t in task["tools"]).replace("_", " ")
        if not (_words(request) - {verb}) & _words(offered):
            return task
    return task


def _words(text: str) -> set[str]:
    """The longer words of a text (five letters or more), lowercased."""
    return {w.lower() for w in re.findall(r"[A-Za-z]{5,}", text)} - {"could", "please"}
