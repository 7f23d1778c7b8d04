"""`task.name: dataset`: prompts and references read from the user's own files.

Files are JSONL, Parquet, CSV, or a directory written by Hugging Face `datasets` (`save_to_disk`), loaded
with `datasets`/pyarrow. Each row gives a prompt (`prompt` text or `messages` chat list), a reference
(`answer`, or `tests` for code) and optionally its own `verifier` and metadata; the column names are
mapped in `task.params`. Every row is checked once at load time, and a bad one is refused with the file,
row (1-based, in file order) and column it was found in and what to do.

Row order is a permutation of the rows drawn per epoch from the job seed, so `item(index)` is a pure
function of (seed, index) and a resumed job continues mid-epoch exactly. `holdout` rows (a fixed
permutation of the file, the same for every seed) are never trained on: they are the evaluation split.

Its params model, `DatasetParams`, is below; datasets and pyarrow are imported only when a file is read, so the
control plane imports this module for the model alone.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, model_validator

from tgc_rl.bounded_read import MAX_CELL_CHARS, DataError, DataLimits, loads_bounded, read_rows
from tgc_rl.tasks.base import Score, Task, TaskItem
from tgc_rl.tasks.grants import HOST_PATHS, UNSAFE_SANDBOX
from tgc_rl.tasks.params import VERIFIERS, SandboxMode, TaskParams, Verifier, needs_grant

if TYPE_CHECKING:
    from pydantic import BaseModel

    from tgc_rl.sandbox import Sandbox

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".csv": "csv"}
DATASET_ID = re.compile(r"ds_[0-9a-f]{32}")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
DATA_ROOT_ENV = "TGC_DATA_ROOT"  # operator-configured directory under which `file` paths resolve
DATASETS_DIR_ENV = "TGC_DATASETS_DIR"  # where the control plane keeps uploaded datasets (by id)
HOLDOUT_SEED = 0x7467  # the held-out rows do not change with the job seed

MAX_ROWS = 10_000_000


class DatasetParams(TaskParams):
    """Where the rows are, which columns hold what, and how responses are verified."""

    path: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        json_schema_extra=needs_grant(HOST_PATHS),
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
        json_schema_extra=needs_grant(UNSAFE_SANDBOX),
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


class DataExhausted(Exception):
    """Every epoch of the dataset has been drawn (`task.params.epochs`)."""


# -- locating and reading -------------------------------------------------------------------------
def resolve_location(p: DatasetParams) -> Path | None:
    """The local file or directory the params name (None for a hub id)."""
    if p.path is not None:
        return Path(p.path).expanduser()
    if p.file is not None:
        root = os.environ.get(DATA_ROOT_ENV)
        if not root:
            raise DataError(
                f"task.params.file {p.file!r}: this server has no data root ({DATA_ROOT_ENV}); upload "
                "the file (`tgc data upload`) and use dataset_id"
            )
        base = Path(root).resolve()
        target = (base / p.file).resolve()
        if base != target and base not in target.parents:  # a symlink leaving the root
            raise DataError(f"task.params.file {p.file!r}: resolves outside the data root")
        return target
    if p.dataset_id is not None:
        return uploaded_file(p.dataset_id)
    return None


def datasets_dir() -> Path:
    """Uploaded datasets as this process sees them (the control plane passes its directory to its jobs)."""
    return Path(os.environ.get(DATASETS_DIR_ENV) or "tgc-data/datasets")


def uploaded_file(dataset_id: str) -> Path:
    """The file of an uploaded dataset: `<datasets dir>/<id>/<its file name>`."""
    if not DATASET_ID.fullmatch(dataset_id):
        raise DataError(f"task.params.dataset_id {dataset_id!r}: not a dataset id (ds_ and 32 hex digits)")
    folder = datasets_dir() / dataset_id
    files = sorted(f for f in folder.iterdir() if not f.name.startswith(".")) if folder.is_dir() else []
    if len(files) != 1:
        raise DataError(
            f"dataset {dataset_id}: not found under {datasets_dir()} (deleted, or this worker does not "
            f"see the control plane's datasets directory; set {DATASETS_DIR_ENV})"
        )
    return files[0]


def detect_format(location: Path, declared: str) -> str:
    if declared != "auto":
        return declared
    if location.is_dir():
        return "arrow"
    fmt = FORMATS.get(location.suffix.lower())
    if fmt is None:
        raise DataError(
            f"{location}: cannot tell the format from the suffix {location.suffix!r}; name the file "
            ".jsonl, .parquet or .csv, or set task.params.format"
        )
    return fmt


def read_table(p: DatasetParams) -> tuple[list[dict[str, Any]], list[str], str]:
    """(rows, column names, label for messages) of the file the params name, at most `max_rows` rows.

    Files are read by the bounded reader (tgc_rl/bounded_read.py) under `DataLimits.from_env()`: the
    caps the control plane checked at upload, which it passes to its jobs."""
    location = resolve_location(p)
    if location is None:
        return _read_hub(p)
    label = str(location)
    if not location.exists():
        raise DataError(f"{label}: no such file or directory")
    fmt = detect_format(location, p.format)
    if fmt == "arrow":
        ds = _load_from_disk(location, p.split)
        n = len(ds) if p.max_rows is None else min(len(ds), p.max_rows)
        return ds.select(range(n)).to_list() if n < len(ds) else ds.to_list(), list(ds.column_names), label
    if location.is_dir():
        raise DataError(f"{label}: a directory, but task.params.format is {fmt!r}; point at the file itself")
    if location.stat().st_size == 0:
        raise DataError(f"{label}: the file is empty; it needs a header (CSV) or at least one row")
    rows, columns = read_rows(location, fmt, DataLimits.from_env(), label, p.max_rows)
    return rows, columns, label


def _load_from_disk(location: Path, split: str | None):
    import datasets

    try:
        ds = datasets.load_from_disk(str(location))
    except (FileNotFoundError, ValueError, OSError) as e:
        raise DataError(f"{location}: not a directory written by datasets' save_to_disk ({e})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split is None:
            raise DataError(f"{location}: holds the splits {sorted(ds)}; choose one with task.params.split")
        if split not in ds:
            raise DataError(f"{location}: no split {split!r}; it has {sorted(ds)}")
        ds = ds[split]
    elif split is not None:
        raise DataError(f"{location}: a single dataset without splits; remove task.params.split")
    if len(ds) == 0:
        raise DataError(f"{location}: no rows")
    return ds


def _read_hub(p: DatasetParams) -> tuple[list[dict[str, Any]], list[str], str]:
    assert p.hub_id is not None  # only called for a hub source
    label = f"hub dataset {p.hub_id}"
    # datasets would read a local directory of that name instead
    if Path(p.hub_id).exists():
        raise DataError(
            f"task.params.hub_id {p.hub_id!r}: a local path of that name exists; use path or file"
        )
    try:
        import datasets

        ds = datasets.load_dataset(p.hub_id, split=p.split or "train")
    except Exception as e:  # offline (ConnectionError, LocalEntryNotFoundError, ...) or no such dataset
        raise DataError(
            f"{label}: cannot be loaded: the Hugging Face hub is not reachable from this worker or "
            f"has no such dataset ({type(e).__name__}: {str(e)[:300]}); download it where a hub is "
            "reachable, save it as JSONL or Parquet and upload it (`tgc data upload`)"
        ) from None
    if p.max_rows is not None and p.max_rows < len(ds):
        ds = ds.select(range(p.max_rows))
    return ds.to_list(), list(ds.column_names), label


# -- rows -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One validated row: everything an item needs, nothing else."""

    id: str
    prompt: str  # the text the model answers (the last user message of a chat)
    messages: tuple[tuple[str, str], ...] | None
    verifier: str
    answer: str | None
    tests: dict[str, Any] | None
    metadata: dict[str, Any]


_ROLES = ("system", "user", "assistant")


def parse_rows(rows: list[dict[str, Any]], columns: list[str], p: DatasetParams, label: str) -> list[Row]:
    """Check every row against the column mapping; raise DataError naming file, row and column."""
    use_messages = p.prompt_column not in columns
    if use_messages and p.messages_column not in columns:
        raise DataError(
            f"{label}: no column {p.prompt_column!r} (prompt text) nor {p.messages_column!r} (chat "
            f"messages); its columns are {columns}. Rename a column or set task.params.prompt_column"
        )
    missing_meta = [c for c in p.metadata_columns if c not in columns]
    if missing_meta:
        raise DataError(
            f"{label}: task.params.metadata_columns {missing_meta} are not columns of the file; it "
            f"has {columns}"
        )
    if p.id_column is not None and p.id_column not in columns:
        raise DataError(f"{label}: task.params.id_column {p.id_column!r} is not a column; it has {columns}")
    out: list[Row] = []
    seen_ids: set[str] = set()
    for i, raw in enumerate(rows):
        where = f"{label}: row {i + 1}"
        verifier = raw.get(p.verifier_column)
        if verifier is None or verifier == "":
            verifier = p.verifier
        elif verifier not in VERIFIERS:
            raise DataError(
                f"{where}, column {p.verifier_column!r}: {verifier!r} is not a verifier; use one of "
                f"{', '.join(VERIFIERS)} (or leave it empty for task.params.verifier)"
            )
        if use_messages:
            messages = _messages(raw.get(p.messages_column), f"{where}, column {p.messages_column!r}")
            prompt = next((c for r, c in reversed(messages) if r == "user"), "")
        else:
            messages = None
            prompt = _text(raw.get(p.prompt_column), f"{where}, column {p.prompt_column!r}", "the prompt")
        answer, tests = None, None
        if verifier == "code":
            tests = _tests(raw.get(p.tests_column), f"{where}, column {p.tests_column!r}")
        else:
            answer = _text(
                raw.get(p.answer_column),
                f"{where}, column {p.answer_column!r}",
                "the reference answer",
                numbers=True,
            )
            if verifier == "regex":
                try:
                    re.compile(answer)
                except re.error as e:
                    raise DataError(
                        f"{where}, column {p.answer_column!r}: not a valid regular expression ({e})"
                    ) from None
        row_id = str(raw.get(p.id_column)) if p.id_column else str(i + 1)
        if p.id_column:
            if row_id in seen_ids:
                raise DataError(
                    f"{where}, column {p.id_column!r}: id {row_id!r} appears twice; ids must be unique"
                )
            seen_ids.add(row_id)
        meta = {c: _plain(raw.get(c), f"{where}, column {c!r}") for c in p.metadata_columns}
        out.append(Row(row_id, prompt, messages, verifier, answer, tests, meta))
    if not out:
        raise DataError(f"{label}: no rows")
    return out


def _text(value: Any, where: str, what: str, numbers: bool = False) -> str:
    if value is None:
        raise DataError(f"{where}: missing ({what} is required in every row)")
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        value = _number_text(value)
    if not isinstance(value, str):
        raise DataError(f"{where}: a {type(value).__name__}, but {what} must be text")
    if not value.strip():
        raise DataError(f"{where}: empty ({what} is required in every row)")
    if len(value) > MAX_CELL_CHARS:
        raise DataError(f"{where}: {len(value):,} characters, more than {MAX_CELL_CHARS:,}; shorten it")
    return value


def _number_text(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _messages(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if isinstance(value, str):
        try:
            value = loads_bounded(value, where)
        except ValueError as e:
            if isinstance(e, DataError):
                raise
            raise DataError(f"{where}: text that is not a JSON list of messages") from None
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: must be a non-empty list of {{role, content}} messages")
    out = []
    for j, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: message {j}: needs role (one of {', '.join(_ROLES)}) and text content")
        out.append((m["role"], m["content"]))
    if out[-1][0] != "user":
        raise DataError(f"{where}: the last message must be the user's (the model answers it)")
    return tuple(out)


def _tests(value: Any, where: str) -> dict[str, Any]:
    from tgc_rl.tasks.code_tests import CodeTests

    if isinstance(value, str):
        try:
            value = loads_bounded(value, where)
        except ValueError as e:
            if isinstance(e, DataError):
                raise
            raise DataError(f"{where}: text that is not a JSON object of tests") from None
    if not isinstance(value, dict):
        raise DataError(
            f'{where}: missing or not an object; `code` rows need tests such as {{"style": "stdio", '
            '"cases": [["1 2\\n", "3\\n"]]}} or {"style": "function", "entry_point": "f", '
            '"test": "assert f(1) == 2"}'
        )
    value = {k: v for k, v in value.items() if v is not None}  # Parquet structs fill absent fields with null
    try:
        tests = CodeTests.from_meta({"tests": value})
    except (ValueError, TypeError) as e:
        raise DataError(f"{where}: {e}") from None
    return tests.to_meta()


def _plain(value: Any, where: str) -> Any:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise DataError(f"{where}: metadata must be plain JSON values") from None
    return value


# -- the task ---------------------------------------------------------------------------------------
class DatasetTask(Task):
    """Rows of a file as a deterministic, resumable stream of TaskItems.

    `role`: `train` (all rows but the held-out ones), `holdout` (only those) or `all`.
    """

    name = "dataset"
    params_model = DatasetParams

    def __init__(
        self,
        seed: int = 0,
        role: Literal["train", "holdout", "all"] = "train",
        params: DatasetParams | None = None,
        **fields: Any,
    ):
        self.params = params if params is not None else DatasetParams.model_validate(fields)
        self.seed, self.role = seed, role
        self._rows: list[Row] | None = None
        self._orders: dict[int, list[int]] = {}
        self.dropped_too_long = 0
        self._sandbox: Sandbox | None = None

    # rows are read on first use: reward workers score items on their own and never need the file
    @property
    def rows(self) -> list[Row]:
        if self._rows is None:
            table, columns, label = read_table(self.params)
            rows = parse_rows(table, columns, self.params, label)
            self._rows = self._split(rows, label)
        return self._rows

    def _split(self, rows: list[Row], label: str) -> list[Row]:
        import numpy as np

        h = self.params.holdout
        if h >= len(rows) and self.role != "all":
            raise DataError(f"{label}: task.params.holdout={h} leaves no rows to train on ({len(rows)} rows)")
        if not h or self.role == "all":
            return rows
        held = set(np.random.default_rng(HOLDOUT_SEED).permutation(len(rows))[:h].tolist())
        keep = held if self.role == "holdout" else set(range(len(rows))) - held
        return [r for i, r in enumerate(rows) if i in keep]

    @classmethod
    def from_params(cls, seed: int, params: BaseModel) -> DatasetTask:
        if not isinstance(params, DatasetParams):
            raise TypeError(f"the dataset task is built from DatasetParams, not {type(params).__name__}")
        return cls(seed=seed, params=params)

    def __len__(self) -> int:
        return len(self.rows)

    def epoch_size(self) -> int:
        return len(self.rows)

    def distinct_items(self) -> int:
        return len(self.rows)

    def filter_prompts(self, fits: Callable[[TaskItem], bool]) -> int:
        """Drop rows whose prompt does not fit (e.g. longer than sampling.max_prompt_tokens); returns how many.

        Done once before the first item, so the permutations run over the kept rows and resume stays exact.
        """
        kept = [r for r in self.rows if fits(self._item(r, r.id))]
        dropped = len(self.rows) - len(kept)
        if not kept:
            raise DataError(
                f"{self.params.source()}: all {len(self.rows)} prompts are longer than the prompt "
                "limit; raise sampling.max_prompt_tokens or shorten them"
            )
        self._rows, self._orders = kept, {}
        self.dropped_too_long += dropped
        return dropped

    def available(self, index: int) -> bool:
        """Whether `item(index)` exists (False once `epochs` passes are drawn)."""
        return self.params.epochs is None or index < self.params.epochs * len(self.rows)

    def order(self, epoch: int) -> list[int]:
        if not self.params.shuffle:
            return list(range(len(self.rows)))
        if epoch not in self._orders:
            import numpy as np

            self._orders = {
                epoch: np.random.default_rng([self.seed, epoch]).permutation(len(self.rows)).tolist()
            }
        return self._orders[epoch]

    def item(self, index: int) -> TaskItem:
        n = len(self.rows)
        if not self.available(index):
            raise DataExhausted(
                f"all {self.params.epochs} epoch(s) of {n} rows of {self.params.source()} are done"
            )
        epoch, pos = divmod(index, n)
        row = self.rows[self.order(epoch)[pos]]
        return self._item(row, f"dataset-{row.id}-e{epoch}")

    def eval_item(self, index: int) -> TaskItem:
        """The index-th row in file order (evaluation: every row once, the same items every time)."""
        row = self.rows[index]
        return self._item(row, f"eval-{row.id}")

    def _item(self, row: Row, item_id: str) -> TaskItem:
        messages = list(row.messages) if row.messages else [("user", row.prompt)]
        if self.params.system_prompt is not None and messages[0][0] != "system":
            messages.insert(0, ("system", self.params.system_prompt))
        meta: dict[str, Any] = {"verifier": row.verifier, "row": row.id, "metadata": row.metadata}
        if row.messages is not None or self.params.system_prompt is not None:
            meta["messages"] = [{"role": r, "content": c} for r, c in messages]
        if row.tests is not None:
            meta["tests"] = {
                **row.tests,
                "timeout_s": min(row.tests.get("timeout_s", 1e9), self.params.timeout_s),
            }
            meta["sandbox"] = {"mode": self.params.sandbox, "memory_mb": self.params.memory_mb}
        return TaskItem(id=item_id, prompt=row.prompt, answer=row.answer, kind="dataset", meta=meta)

    def score(self, item: TaskItem, response: str) -> Score:
        return score_row(item, response, self.sandbox)

    def sandbox(self, mode: str = "bwrap", memory_mb: int | None = None):
        if self._sandbox is None:
            from tgc_rl.tasks.code_tests import make_sandbox

            self._sandbox = make_sandbox(mode, memory_mb)
        return self._sandbox

    def warm_up(self) -> None:
        from tgc_rl.tasks import math_equivalence

        math_equivalence.warm_up()


# -- verifiers --------------------------------------------------------------------------------------
def score_row(item: TaskItem, response: str, sandbox: Callable[..., Any]) -> Score:
    """Verify a response to a dataset item with the row's verifier; `sandbox(mode, memory_mb)` gives the code
    sandbox. Needs nothing but the item, so any reward worker can score any dataset's items."""
    verifier = item.meta.get("verifier")
    if verifier == "math":
        from tgc_rl.tasks.math_equivalence import verify_math

        return verify_math(item.answer or "", response)
    if verifier == "exact":
        want = normalise_answer(item.answer or "")
        got = [normalise_answer(c) for c in final_answers(response)]
        return Score(float(want in got), detail="exact match" if want in got else "no exact match")
    if verifier == "regex":
        found = re.search(item.answer or "", response) is not None
        return Score(float(found), detail="pattern found" if found else "pattern not found")
    if verifier == "code":
        from tgc_rl.tasks.code_tests import CodeTests, score_code

        box = item.meta.get("sandbox") or {}
        return score_code(
            sandbox(box.get("mode", "bwrap"), box.get("memory_mb")), CodeTests.from_meta(item.meta), response
        )
    raise ValueError(f"dataset item {item.id}: unknown verifier {verifier!r}")


def final_answers(response: str) -> list[str]:
    """The readings of a response that may be its final answer (tag, boxed value, whole text, last line)."""
    from tgc_rl.tasks.gym import candidate_answers

    return candidate_answers(response)


def normalise_answer(text: str) -> str:
    """Case, Unicode form, surrounding quotes/punctuation and inner whitespace do not count."""
    text = unicodedata.normalize("NFKC", text).casefold().strip()
    text = re.sub(r"\s+", " ", text)
    return text.strip(" .'\"`")
