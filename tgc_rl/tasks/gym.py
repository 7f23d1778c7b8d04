"""reasoning-gym tasks (`task.name: reasoning_gym:<dataset>`), scored by each dataset's own scorer.

`task.params` are `size` (items before the stream repeats), `instruction` (appended to each question)
and any of the dataset's config fields (e.g. {min_terms: 2, max_terms: 2} for basic_arithmetic).
The answer is read leniently: an <answer> tag when the response has one, else the best of the boxed
value, the whole reply, its last line and its last number (a small model rarely follows formats).
"""

from __future__ import annotations

import re
from typing import Any

from tgc_rl.tasks.answers import last_number
from tgc_rl.tasks.base import Score, Task, TaskItem

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
DEFAULT_INSTRUCTION = "\nReply with just the answer."


class ReasoningGymTask(Task):
    def __init__(
        self,
        dataset: str,
        seed: int = 0,
        size: int = 10_000,
        instruction: str = DEFAULT_INSTRUCTION,
        **config: Any,
    ):
        import reasoning_gym

        if not 1 <= size <= 10_000_000:
            raise ValueError(f"task.params.size={size}: must be between 1 and 10,000,000")
        try:
            self.dataset = reasoning_gym.create_dataset(dataset, size=size, seed=seed, **config)
        except (KeyError, ValueError, TypeError, AssertionError) as e:
            raise ValueError(
                f"task.name 'reasoning_gym:{dataset}' with params {config!r}: {e}; see the "
                "dataset's config class in reasoning_gym for its fields and ranges"
            ) from None
        self.name = f"reasoning_gym:{dataset}"
        self.seed, self.size, self.instruction = seed, size, instruction

    def item(self, index: int) -> TaskItem:
        entry = self.dataset[index % self.size]
        answer = entry.get("answer")
        return TaskItem(
            id=f"{self.name}-{self.seed}-{index}",
            prompt=entry["question"] + self.instruction,
            answer=None if answer is None else str(answer),
            kind="gym",
            meta={"entry": entry},
        )

    def score(self, item: TaskItem, response: str) -> Score:
        entry = item.meta["entry"]
        best, best_answer, first_error, scored = 0.0, None, None, False
        for candidate in candidate_answers(response):
            try:
                value = float(self.dataset.score_answer(candidate, entry))
            except Exception as e:  # a scorer choking on one reading of garbage; other readings may parse
                first_error = first_error or e
                continue
            scored = True
            if value > best:
                best, best_answer = value, candidate
        if not scored and first_error is not None:  # the scorer failed on every reading: an error, not a 0
            raise first_error
        detail = f"answer {best_answer!r}" if best_answer is not None else "no accepted answer"
        return Score(best, detail=detail)


def candidate_answers(response: str) -> list[str]:
    """The readings of a response worth scoring, most explicit first."""
    tagged = _ANSWER_TAG.findall(response)
    if tagged:
        return [tagged[-1].strip()]
    out: list[str] = []
    boxed = _BOXED.findall(response)
    if boxed:
        out.append(boxed[-1].strip())
    text = response.strip()
    if text:
        out.append(text)
        out.append(text.splitlines()[-1].strip())
    number = last_number(response)
    if number is not None:
        out.append(number)
    return list(dict.fromkeys(c for c in out if c))
