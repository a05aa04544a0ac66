"""Per-capability adapter training: SFT warm-start on oracle demonstrations, then GRPO on the verifier."""

from traceops.train.adapter import TrainResult, train_adapter
from traceops.train.budgets import BUDGETS, Budget, get_budget
from traceops.train.config import AdapterSettings

__all__ = ["BUDGETS", "AdapterSettings", "Budget", "TrainResult", "get_budget", "train_adapter"]
