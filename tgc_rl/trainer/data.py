"""The prompt stream of a job: deterministic by index, tokenised once, with a resumable position; and the
sampling seeds derived from the job seed."""

from __future__ import annotations

from dataclasses import dataclass

from tgc_rl.config import JobSpec, ModelSpec
from tgc_rl.tasks import TaskItem, load_task
from tgc_rl.tasks.grants import job_grants

_SEED_MODULUS = 2**31 - 1  # the rollout engines take 31-bit seeds


def derive_seed(job_seed: int, index: int, salt: int = 0) -> int:
    """The one derivation of every seed a job draws from its own (sampling a prompt's group, a revision, an
    evaluation, which traces to keep): distinct `index`/`salt` give unrelated seeds, and the same ones the
    same seed on every run and every resume."""
    return (job_seed * 1_000_003 + index * 7_919 + salt) % _SEED_MODULUS


@dataclass
class Prompt:
    """One tokenised prompt: the `index`-th of a stream (training) or of the evaluation rows."""

    index: int
    item: TaskItem
    token_ids: list[int]


class PromptSource:
    def __init__(self, spec: JobSpec, tokenizer, position: int = 0):
        self.spec, self.tokenizer, self.position = spec, tokenizer, position
        self.task = load_task(spec.task.name, spec.task.params, spec.seed, job_grants())
        # a task that can (a dataset) drops long prompts, counted, before the first; others refuse them in prompt()
        limit = spec.sampling.max_prompt_tokens
        self.dropped_too_long = self.task.filter_prompts(lambda item: len(self.encode_item(item)) <= limit)

    def available(self, n: int) -> bool:
        """Whether the next n prompts exist (a dataset with `epochs` runs out)."""
        return self.task.available(self.position + n - 1)

    def take(self, n: int) -> list[Prompt]:
        """The next n prompts of the stream; the position only moves forward (it is checkpointed)."""
        out = [self.prompt(self.position + k) for k in range(n)]
        self.position += n
        return out

    def prompt(self, index: int) -> Prompt:
        item = self.task.item(index)
        ids = self.encode_item(item)
        if len(ids) > self.spec.sampling.max_prompt_tokens:
            raise ValueError(
                f"task item {item.id} has {len(ids)} prompt tokens, more than sampling.max_prompt_tokens "
                f"({self.spec.sampling.max_prompt_tokens}); raise the limit or shorten the prompts"
            )
        return Prompt(index, item, ids)

    def encode(self, text: str) -> list[int]:
        return encode_item(self.tokenizer, self.spec.model, TaskItem(id="", prompt=text))

    def encode_item(self, item: TaskItem) -> list[int]:
        return encode_item(self.tokenizer, self.spec.model, item)


def encode_item(tokenizer, model: ModelSpec, item: TaskItem) -> list[int]:
    """A prompt's token ids: its own chat messages (dataset rows) or its text as the user turn, after the
    model's system prompt, through the chat template; the bare text when the template is off."""
    messages = item.meta.get("messages")
    if not model.chat_template:
        if messages is not None:
            raise ValueError(f"item {item.id}: chat messages need model.chat_template: true")
        return tokenizer(item.prompt, add_special_tokens=True)["input_ids"]
    if messages is None:
        messages = [{"role": "system", "content": model.system_prompt}] if model.system_prompt else []
        messages.append({"role": "user", "content": item.prompt})
    elif model.system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": model.system_prompt}, *messages]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
