"""`tgc data export`: write rows of a built-in task as a dataset file (JSONL or Parquet) that the `dataset`
task reads back, so a job can train or evaluate on real files made here (and a user sees the format).

Math-style rows get `verifier: math` when the reference is a number and `exact` otherwise; code rows carry
their tests (a JSON object in JSONL, its JSON text in Parquet, where rows' test shapes differ).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tgc_rl.tasks.answers import last_number
from tgc_rl.tasks.grants import LOCAL_GRANTS
from tgc_rl.tasks.registry import BUILTIN_TASKS, GYM_PREFIX, builtin_names, load_task

MAX_EXPORT_ROWS = 1_000_000


def export_rows(
    task: str, params: dict[str, Any] | None = None, rows: int = 100, seed: int = 0
) -> list[dict]:
    """The first `rows` items of a built-in task as dataset rows (prompt, answer or tests, verifier, source)."""
    if not 1 <= rows <= MAX_EXPORT_ROWS:
        raise ValueError(f"rows={rows}: must be between 1 and {MAX_EXPORT_ROWS:,}")
    entry = BUILTIN_TASKS.get(task)
    custom = ":" in task and not task.startswith(GYM_PREFIX)
    if custom or (entry is not None and not entry.exportable):  # an unknown name: load_task says so
        raise ValueError(
            f"task {task!r}: export a built-in task ({', '.join(builtin_names(exportable_only=True))})"
        )
    source = load_task(task, params or {}, seed, LOCAL_GRANTS)
    if (distinct := source.distinct_items()) is not None:
        rows = min(rows, distinct)  # each item once
    out: list[dict] = []
    for i in range(rows):
        item = source.item(i)
        row: dict[str, Any] = {"id": f"{task}-{seed}-{i}", "prompt": item.prompt}
        if item.kind == "code":
            tests = {k: v for k, v in item.meta["tests"].items() if k != "timeout_s"}
            row.update(tests=tests, verifier="code")
        else:
            if item.answer is None:  # an open-ended reasoning-gym answer: checked by simulation only
                continue
            row.update(
                answer=item.answer,
                verifier="math"
                if last_number(item.answer) == item.answer.strip().replace(",", "")
                else "exact",
            )
        out.append(row)
    if not out:
        raise ValueError(f"task {task!r}: none of its first {rows} items has a reference answer to export")
    return out


def write_rows(rows: list[dict], path: str | Path) -> Path:
    """Write rows as .jsonl/.json (one object a line) or .parquet, chosen by the suffix."""
    path = Path(path)
    suffix = path.suffix.lower()
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix in (".jsonl", ".json", ".ndjson"):
        with open(path, "w") as fh:
            for r in rows:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    elif suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = [{**r, "tests": json.dumps(r["tests"])} if "tests" in r else r for r in rows]
        columns = list(dict.fromkeys(k for r in flat for k in r))
        pq.write_table(pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in flat]), path)
    else:
        raise ValueError(f"{path}: use a .jsonl or .parquet file name")
    return path
