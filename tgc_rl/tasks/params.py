"""Each built-in task's declared `task.params`: a typed, bounded schema checked where the spec is parsed.

A spec that the API accepts must be one that can start, so the control plane validates `task.params`
against these models at submit time (the same models build the task on the worker), and `tgc schema`
publishes them; tgc_rl.tasks.registry says which task has which. Fields that only the operator may switch
carry `json_schema_extra={"privilege": ...}` (tgc_rl.tasks.grants.privileged_fields lists those set).

This module imports pydantic only (reasoning-gym lazily), so the control plane and the SDK can use it.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import datetime
import enum
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonDict

from tgc_rl.tasks.grants import HOST_PATHS, UNSAFE_SANDBOX

MAX_TEMPLATE_CHARS = 4096


class TaskParams(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


def _needs(privilege: str) -> JsonDict:
    return {"privilege": privilege}


# A slot is `{name}`; any other brace is matched too, so that check_template can name what it is. Linear.
_BRACES = re.compile(r"\{([^{}]*)\}|[{}]")
_AFTER_NAME = re.compile(r"\w*([:!.\[])")


def check_template(template: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> str:
    """Refuse anything in braces but a `{name}` slot of `allowed`, and a missing `required` slot.

    Templates are filled by `fill_template` (literal substitution), never by `str.format`: a format spec
    (`{prompt:>2000000000}`, a width chosen by a value) would cost unbounded memory and a conversion or an
    attribute or index would reach Python objects, so each is refused here, with what to write instead.
    """
    slots = ", ".join("{" + a + "}" for a in allowed)
    seen = set()
    for m in _BRACES.finditer(template):
        inner = m.group(1)
        if inner in allowed:
            seen.add(inner)
            continue
        at = f"{template[m.start() : m.start() + 40]!r} at character {m.start()}"
        # what follows the slot's name says what str.format would have read there
        after = _AFTER_NAME.match(template, m.start() + 1) if m.group(0)[0] == "{" else None
        why = {
            ":": "a format spec (no width, fill or precision: slots are filled literally)",
            "!": "a conversion (slots are filled literally)",
            ".": "attribute access (slots are filled literally)",
            "[": "index access (slots are filled literally)",
        }.get(after.group(1) if after else "", "a lone brace" if inner is None else "an unknown slot")
        raise ValueError(
            f"{at}: {why}; braces may only enclose a slot ({slots}), written exactly so, "
            "and there is no escape for a literal brace"
        )
    missing = [r for r in required if r not in seen]
    if missing:
        raise ValueError(
            f"missing the slot(s) {', '.join('{' + r + '}' for r in missing)}; the slots are {slots}"
        )
    return template


def fill_template(template: str, **values: object) -> str:
    """Substitute each `{name}` slot of `values` literally, in one pass over the template: a value is never
    read as a template (a response holding `{references}` stays as written), a template never reaches
    attributes or format specs the way `str.format` does, and anything else in braces stays as typed."""
    return _BRACES.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template)


class ArithmeticParams(TaskParams):
    max_operand: int = Field(9, ge=0, le=10**9, description="Largest operand.")
    min_operand: int = Field(0, ge=0, le=10**9, description="Smallest operand (<= max_operand).")
    ops: list[Literal["+", "-", "*"]] = Field(["+"], min_length=1, max_length=3, description="Operators.")
    template: str = Field(
        "What is {a} {op} {b}? Reply with just the number.",
        min_length=1,
        max_length=MAX_TEMPLATE_CHARS,
        description="Question; slots {a}, {op}, {b}.",
    )

    @field_validator("template")
    @classmethod
    def _slots(cls, v: str) -> str:
        check_template(v, ("a", "op", "b"))
        return v

    @field_validator("min_operand")
    @classmethod
    def _ordered(cls, v: int, info) -> int:
        if "max_operand" in info.data and v > info.data["max_operand"]:
            raise ValueError("need min_operand <= max_operand")
        return v


SandboxMode = Literal["bwrap", "unsafe_local"]
_SANDBOX_DOC = (
    "`bwrap` (default): model-written code runs in the bubblewrap sandbox. `unsafe_local` runs it "
    "WITHOUT isolation; only the operator can allow it (server setting or admin token)."
)


class CodeParams(TaskParams):
    families: list[str] | None = Field(
        None, min_length=1, max_length=64, description="Problem families (default all)."
    )
    cases: int = Field(3, ge=1, le=100, description="Test cases per problem.")
    timeout_s: float = Field(5.0, gt=0, le=120, description="Wall-clock limit of one test run.")
    sandbox: SandboxMode = Field("bwrap", description=_SANDBOX_DOC, json_schema_extra=_needs(UNSAFE_SANDBOX))
    memory_mb: int | None = Field(None, ge=16, le=65_536, description="Address-space limit of a test run.")
    partial_credit: bool = Field(
        False, description="Reward the share of passed cases instead of all-or-nothing."
    )


HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function in a ```python "
    "code block.\n\n```python\n{prompt}```"
)


class HumanEvalParams(TaskParams):
    shuffle: bool = Field(True, description="A seeded permutation of the 164 problems, redrawn every pass.")
    timeout_s: float = Field(10.0, gt=0, le=120, description="Wall-clock limit of one test run.")
    sandbox: SandboxMode = Field("bwrap", description=_SANDBOX_DOC, json_schema_extra=_needs(UNSAFE_SANDBOX))
    memory_mb: int | None = Field(None, ge=16, le=65_536, description="Address-space limit of a test run.")
    instruction: str = Field(
        HUMANEVAL_INSTRUCTION,
        max_length=MAX_TEMPLATE_CHARS,
        description="Prompt around the problem; must hold the slot {prompt}.",
    )

    @field_validator("instruction")
    @classmethod
    def _slot(cls, v: str) -> str:
        check_template(v, ("prompt",), required=("prompt",))
        return v


class ReasoningGymParams(TaskParams):
    """`size`, `instruction`, and the dataset's own config fields (checked against its config class)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, frozen=True)
    size: int = Field(10_000, ge=1, le=10_000_000, description="Items before the stream repeats.")
    instruction: str = Field(
        "\nReply with just the answer.",
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


Verifier = Literal["math", "exact", "regex", "code"]
VERIFIERS: tuple[str, ...] = typing.get_args(Verifier)
MAX_ROWS = 10_000_000


class DatasetParams(TaskParams):
    """Where the rows are, which columns hold what, and how responses are verified."""

    path: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        json_schema_extra=_needs(HOST_PATHS),
        description="A file or `save_to_disk` directory on the workers' hosts (operators and admin tokens only; "
        "tenants use `dataset_id` or `file`).",
    )
    file: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="A path relative to the server's data root (`TGC_DATA_ROOT`, set by the operator); it may "
        "not leave that directory.",
    )
    dataset_id: str | None = Field(
        None,
        pattern=r"^ds_[0-9a-f]{32}$",
        description="A dataset uploaded by this tenant (`tgc data upload`, `POST /v1/datasets`).",
    )
    hub_id: str | None = Field(
        None,
        max_length=193,
        pattern=r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$",
        description="A Hugging Face hub dataset `owner/name`; needs a hub the workers can reach.",
    )
    format: Literal["auto", "jsonl", "parquet", "csv", "arrow"] = Field(
        "auto",
        description="`auto`: from the file suffix (.jsonl/.json, .parquet, .csv) or a `save_to_disk` "
        "directory (`arrow`).",
    )
    split: str | None = Field(
        None,
        max_length=128,
        pattern=r"^[\w.-]+$",
        description="Split of a `save_to_disk` DatasetDict or a hub dataset.",
    )
    prompt_column: str = Field("prompt", min_length=1, max_length=256, description="Prompt text.")
    messages_column: str = Field(
        "messages",
        min_length=1,
        max_length=256,
        description="Chat messages [{role, content}, ...]; used when the prompt column "
        "is absent (needs model.chat_template).",
    )
    answer_column: str = Field(
        "answer",
        min_length=1,
        max_length=256,
        description="Reference answer (math, exact) or pattern (regex).",
    )
    tests_column: str = Field(
        "tests",
        min_length=1,
        max_length=256,
        description="Code tests (a JSON object: {style: stdio, cases: [[stdin, stdout], "
        "...]} or {style: function, entry_point, test}) for `code` rows.",
    )
    verifier_column: str = Field(
        "verifier",
        min_length=1,
        max_length=256,
        description="Per-row verifier name; rows without one use `verifier`.",
    )
    id_column: str | None = Field(
        None, min_length=1, max_length=256, description="Row id (default: row number)."
    )
    metadata_columns: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        [], max_length=64, description="Columns kept with each item as metadata."
    )
    verifier: Verifier = Field(
        "math",
        description="Default verifier: `math` (math-verify, then the last number), `exact` (normalised "
        "exact match of the final answer), `regex` (the reference is a pattern searched in the response), "
        "`code` (the row's tests in the sandbox).",
    )
    system_prompt: str | None = Field(
        None,
        max_length=16_384,
        description="System message before each prompt (overrides model.system_prompt).",
    )
    shuffle: bool = Field(
        True, description="A new permutation of the rows every epoch, drawn from the job seed."
    )
    epochs: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Passes over the data; the job ends when they are done (default: `steps` decides).",
    )
    holdout: int = Field(
        0,
        ge=0,
        le=MAX_ROWS,
        description="Rows kept out of training for evaluation "
        "(`eval` without a dataset); the same rows for every seed.",
    )
    max_rows: int | None = Field(
        None, ge=1, le=MAX_ROWS, description="Use only the first N rows of the file."
    )
    timeout_s: float = Field(10.0, gt=0, le=120, description="Wall-clock limit of one code test run.")
    sandbox: SandboxMode = Field(
        "bwrap",
        json_schema_extra=_needs(UNSAFE_SANDBOX),
        description="Sandbox of `code` rows; `unsafe_local` (no isolation) is the operator's decision.",
    )
    memory_mb: int | None = Field(
        None, ge=16, le=65_536, description="Address-space limit of a code test run."
    )

    @model_validator(mode="after")
    def _one_source(self) -> DatasetParams:
        given = [k for k in ("path", "file", "dataset_id", "hub_id") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of path, file, dataset_id, hub_id (got {', '.join(given) or 'none'})"
            )
        if self.file is not None and (self.file.startswith(("/", "~")) or ".." in Path(self.file).parts):
            raise ValueError("file: must be a relative path inside the data root, without '..'")
        return self

    def source(self) -> str:
        """What the rows come from, for messages."""
        return self.path or self.file or self.dataset_id or f"hub:{self.hub_id}"


M = TypeVar("M", bound=BaseModel)


def validate_params(model: type[M], params: dict[str, Any], field: str = "task.params") -> M:
    """`params` as `model`; raises ValueError whose lines start with `<field>.<name>` (task.params.<name>)."""
    try:
        return model.model_validate(params)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"])
            msg = (
                "unknown field; known: " + ", ".join(model.model_fields)
                if err["type"] == "extra_forbidden"
                else str(err["msg"]).removeprefix("Value error, ")
            )
            lines.append(f"{field}.{loc}: {msg}" if loc else f"{field}: {msg}")
        raise ValueError("; ".join(lines)) from None
