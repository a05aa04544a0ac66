"""SFT loss with the batch's shared prompt prefix computed once.

Every demonstration of a family starts with the same system prompt and tool schemas (about 760 of the
1,100-1,400 tokens of a multi-turn episode here), and none of it carries loss. The plain step runs the
model over that prefix once per row. Here the prefix runs once, at batch 1, its keys and values are
repeated to every row, and the rows' own tokens run on top of them; the loss is the same token-mean
cross entropy over the assistant tokens. Gradients flow through the repeated keys and values into the
prefix pass, so the result equals the plain step up to float rounding (tests check loss and gradients).
Only the linear layers' work on the prefix is saved: each row still attends to all of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IGNORE = -100
# A shorter shared prefix saves less than the extra pass costs.
MIN_SHARED_TOKENS = 32
# Config fields of models whose logits are scaled or soft-capped after the LM head.
SCALING_FIELDS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier")


@dataclass
class PrefixLoss:
    """The loss of one batch and the token statistics TRL logs for it."""

    loss: Any
    supervised: int
    correct: int
    entropy_sum: float


def shared_prefix_length(input_ids: Any, attention_mask: Any, labels: Any) -> int:
    """Leading tokens all rows share that carry no loss, nor does the token right after them (its logit
    comes from the prefix's last position); each row keeps at least one token of its own."""
    import torch

    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(dim=0) & attention_mask.bool().all(dim=0)
    shared = int(torch.cumprod(same.long(), dim=0).sum())
    shared = min(shared, int(attention_mask.sum(dim=1).min()) - 1)
    supervised = (labels != IGNORE).any(dim=0)
    if bool(supervised.any()):
        shared = min(shared, int(supervised.long().argmax()) - 1)
    return max(shared, 0)


def supports_shared_prefix(causal_lm: Any) -> bool:
    """True for causal LMs whose logits are the plain LM head of the decoder's last hidden state (no
    soft-capping or scaling; those go through TRL's own loss)."""
    config = causal_lm.config.get_text_config()
    scaled = any(getattr(config, name, None) not in (None, 1.0) for name in SCALING_FIELDS)
    return not scaled and hasattr(causal_lm, "base_model") and causal_lm.get_output_embeddings() is not None


def prefix_shared_loss(causal_lm: Any, input_ids: Any, attention_mask: Any, labels: Any, shared: int,
                       num_items_in_batch: Any = None) -> PrefixLoss:
    """Token-mean cross entropy of ``labels`` (IGNORE where no loss) with the first ``shared`` tokens
    run once. ``causal_lm`` is the HF causal LM (PEFT's LoRA layers live inside it); the mean divides by
    ``num_items_in_batch`` when given (the Trainer's count over gradient accumulation), as TRL does."""
    import torch
    import torch.nn.functional as F
    from transformers import DynamicCache

    batch, length = input_ids.shape
    decoder = causal_lm.base_model
    cache = DynamicCache(config=causal_lm.config)
    positions = torch.arange(length, device=input_ids.device).unsqueeze(0)
    decoder(input_ids=input_ids[:1, :shared], attention_mask=attention_mask[:1, :shared],
            position_ids=positions[:, :shared], cache=cache, use_cache=True)
    cache.batch_repeat_interleave(batch)
    own = decoder(input_ids=input_ids[:, shared:], attention_mask=attention_mask,
                  position_ids=positions[:, shared:].expand(batch, -1), cache=cache, use_cache=True)
    hidden = own.last_hidden_state[:, :-1]  # position t predicts the label at t + 1
    targets = labels[:, shared + 1:]
    keep = targets != IGNORE
    logits = causal_lm.get_output_embeddings()(hidden[keep]).float()
    picked = targets[keep]
    total = F.cross_entropy(logits, picked, reduction="sum")
    count = int(keep.sum())
    denominator = num_items_in_batch if num_items_in_batch is not None else max(count, 1)
    with torch.no_grad():
        log_probs = torch.log_softmax(logits, dim=-1)
        entropy = float(-(log_probs.exp() * log_probs).sum())
        correct = int((logits.argmax(dim=-1) == picked).sum())
    return PrefixLoss(loss=total / torch.as_tensor(denominator).clamp(min=1), supervised=count,
                      correct=correct, entropy_sum=entropy)
