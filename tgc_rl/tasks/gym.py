"""reasoning-gym tasks (`task.name: reasoning_gym:<dataset>`), scored by each dataset's own scorer.

`task.params` are `size` (items before the stream repeats), `instruction` (appended to each question)
and any of the dataset's config fields (e.g. {min_terms: 2, max_terms: 2} for basic_arithmetic).
The answer is read leniently: an <answer> tag when the response has one, else the best of the boxed
value, the whole reply, its last line and its last number (a small model rarely follows formats).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import datetime
import enum
import re
import types
import typing
from typing import Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from tgc_rl.tasks.answers import last_number
from tgc_rl.tasks.base import Score, Task, TaskItem
from tgc_rl.tasks.params import MAX_TEMPLATE_CHARS, TaskParams

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
DEFAULT_INSTRUCTION = "\nReply with just the answer."


class ReasoningGymParams(TaskParams):
    """`size`, `instruction`, and the dataset's own config fields (checked against its config class)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, frozen=True)
    size: int = Field(10_000, ge=1, le=10_000_000, description="Items before the stream repeats.")
    instruction: str = Field(
        DEFAULT_INSTRUCTION,
        max_length=MAX_TEMPLATE_CHARS,
        description="Appended to each question.",
    )

    def dataset_config(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


# Types of reasoning-gym config fields that hold plain data. A `str` field may name a file the dataset
# reads (spell_backward's `data_file` reads any path), so str fields are accepted only where listed here.
_GYM_SAFE_SCALARS = (int, float, bool, datetime.date, datetime.time)
_GYM_SAFE_STR_FIELDS = frozenset({("caesar_cipher", "delimiter"), ("figlet_font", "static_word")})
_GYM_REFUSED_DATASETS = {"composite": "it composes other datasets with free configs; use one dataset a job"}


def _plain_data_type(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return True
    if origin in (typing.Union, types.UnionType):
        return all(a is type(None) or _plain_data_type(a) for a in typing.get_args(tp))
    if origin in (list, tuple, collections.abc.Sequence):
        return all(a is Ellipsis or _plain_data_type(a) or a is str for a in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return True
    return tp in _GYM_SAFE_SCALARS or tp is tuple


def check_gym_config(dataset: str, config: dict[str, Any]) -> None:
    """Raise ValueError naming the field if `config` is not plain data the dataset's config class accepts.

    Without reasoning-gym installed (a thin SDK install) only the field names' syntax is checked here;
    the worker checks again when it builds the dataset.
    """
    if dataset in _GYM_REFUSED_DATASETS:
        raise ValueError(
            f"task.name: reasoning_gym:{dataset} is not accepted: {_GYM_REFUSED_DATASETS[dataset]}"
        )
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        return
    if dataset not in DATASETS:
        raise ValueError(
            f"task.name: no reasoning-gym dataset {dataset!r}; e.g. basic_arithmetic, chain_sum, "
            "leg_counting (reasoning_gym.factory.DATASETS lists them)"
        )
    config_cls = DATASETS[dataset][1]
    hints = typing.get_type_hints(config_cls)
    fields = {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(config_cls)}
    for key, value in config.items():
        path = f"task.params.{key}"
        if key in ("seed", "size") or key not in fields:
            known = sorted(k for k in fields if k not in ("seed", "size"))
            raise ValueError(f"{path}: not a field of reasoning-gym's {config_cls.__name__}; known: {known}")
        tp = fields[key]
        if not (_plain_data_type(tp) or ((dataset, key) in _GYM_SAFE_STR_FIELDS)):
            raise ValueError(
                f"{path}: this field ({tp}) can name files or objects on the worker; it is not "
                "accepted in a job spec"
            )
        try:
            TypeAdapter(tp).validate_python(value, strict=False)
        except ValidationError as e:
            raise ValueError(f"{path}: {e.errors()[0]['msg']}") from None
    try:
        cfg = config_cls(**config)
        if hasattr(cfg, "validate"):
            cfg.validate()
    except (AssertionError, ValueError, TypeError) as e:
        raise ValueError(
            f"task.params: reasoning-gym's {config_cls.__name__} refuses {config}: {e}"
        ) from None


class ReasoningGymTask(Task):
    params_model = ReasoningGymParams

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
