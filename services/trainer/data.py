"""The prompt stream of a job: deterministic by index, tokenised once, with a resumable position."""

from __future__ import annotations

from dataclasses import dataclass

from services.config import JobSpec
from services.tasks import TaskItem, load_task
from services.tasks.params import job_grants


@dataclass
class Prompt:
    index: int
    item: TaskItem
    token_ids: list[int]


class PromptSource:
    def __init__(self, spec: JobSpec, tokenizer, position: int = 0):
        self.spec, self.tokenizer, self.position = spec, tokenizer, position
        self.task = load_task(spec.task.name, spec.task.params, spec.seed, job_grants())

    def take(self, n: int) -> list[Prompt]:
        """The next n prompts of the stream; the position only moves forward (it is checkpointed)."""
        out = [self.prompt(self.position + k) for k in range(n)]
        self.position += n
        return out

    def prompt(self, index: int) -> Prompt:
        item = self.task.item(index)
        ids = self.encode(item.prompt)
        if len(ids) > self.spec.sampling.max_prompt_tokens:
            raise ValueError(
                f"task item {item.id} has {len(ids)} prompt tokens, more than sampling.max_prompt_tokens "
                f"({self.spec.sampling.max_prompt_tokens}); raise the limit or shorten the prompts"
            )
        return Prompt(index, item, ids)

    def encode(self, text: str) -> list[int]:
        m = self.spec.model
        if not m.chat_template:
            return self.tokenizer(text, add_special_tokens=True)["input_ids"]
        messages = ([{"role": "system", "content": m.system_prompt}] if m.system_prompt else [])
        messages.append({"role": "user", "content": text})
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
