"""Tasks: deterministic prompt sources with their verifiers."""

from services.tasks.base import Score, Task, TaskItem
from services.tasks.grants import GrantError
from services.tasks.registry import load_task

__all__ = ["GrantError", "Score", "Task", "TaskItem", "load_task"]
