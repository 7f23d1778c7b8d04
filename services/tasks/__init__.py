"""Tasks: deterministic prompt sources with their verifiers."""

from services.tasks.base import GrantError, Score, Task, TaskItem
from services.tasks.registry import load_task

__all__ = ["GrantError", "Score", "Task", "TaskItem", "load_task"]
