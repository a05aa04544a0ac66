"""The scripted retail customer: deterministic, no LLM.

It opens with the task's instruction. To each assistant message without a tool call it either
answers a question with one of its facts (the first cue, in ``CUES`` order, that the question
mentions) or, when the message asks nothing it knows, ends the conversation (returns None).
"""

from __future__ import annotations

# (fact key, phrases in the assistant's question that ask for it), most specific first.
CUES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("order_id", ("order id", "order number", "order #", "which order")),
    ("email", ("email", "e-mail")),
    ("name_zip", ("zip", "postal", "your name", "full name")),
    ("confirm", ("confirm", "proceed", "go ahead", "shall i", "should i", "would you like me",
                 "do you want me")),
)


class ScriptedUser:
    """Answers follow-up questions from ``facts``; at most ``max_replies`` answers per episode."""

    def __init__(self, instruction: str, facts: dict[str, str], max_replies: int = 4) -> None:
        self.instruction = instruction
        self.facts = dict(facts)
        self.max_replies = max_replies
        self.replies = 0

    def opening(self) -> str:
        """The first user message: the task instruction."""
        return self.instruction

    def reply(self, text: str) -> str | None:
        """The answer to an assistant message, or None when the customer is done."""
        if self.replies >= self.max_replies or "?" not in text:
            return None
        lowered = text.lower()
        for key, phrases in CUES:
            if key in self.facts and any(phrase in lowered for phrase in phrases):
                self.replies += 1
                return self.facts[key]
        return None
