"""Tasks: deterministic prompt sources with their verifiers."""

from services.tasks.base import Score, Task, TaskItem, load_task

__all__ = ["Score", "Task", "TaskItem", "load_task"]
