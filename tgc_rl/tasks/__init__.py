"""Tasks: deterministic prompt sources with their verifiers."""

from tgc_rl.tasks.base import Score, Task, TaskItem
from tgc_rl.tasks.grants import GrantError
from tgc_rl.tasks.registry import load_task

__all__ = ["GrantError", "Score", "Task", "TaskItem", "load_task"]
