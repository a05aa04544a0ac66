"""The bundled retail operating domain: a seeded store database, its tools, policy, tasks and verifier."""

from traceops.domains.retail.env import RetailEnv
from traceops.domains.retail.policy import POLICY
from traceops.domains.retail.task import KINDS, Task
from traceops.domains.retail.tasks import DEFAULT_COUNT, generate_tasks, get_task

__all__ = ["DEFAULT_COUNT", "KINDS", "POLICY", "RetailEnv", "Task", "generate_tasks", "get_task"]
