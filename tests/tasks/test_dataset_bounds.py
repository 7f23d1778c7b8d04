"""The bounded reader (tgc_rl/bounded_read.py) as the `dataset` task uses it: the same caps and refusals as
an upload, the nesting pre-scan exact on valid JSON, and no input that raises anything but DataError."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tgc_rl.bounded_read import DataError, DataLimits, inspect_file, nesting_depth, read_rows
from tgc_rl.tasks.dataset import DatasetTask


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


_TRICKY = st.text(st.sampled_from(list('[]{}"\\ab,:\n\u00e9')), max_size=12)  # text that looks structural
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | _TRICKY,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TRICKY, inner, max_size=4),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=_JSON, ascii_only=st.booleans())
def test_the_nesting_prescan_is_exact_on_valid_json(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert nesting_depth(text) == _depth(value)


def test_the_prescan_is_linear_on_a_deep_row():
    import time

    started = time.process_time()
    assert nesting_depth(b"[" * 2_000_000 + b"]" * 2_000_000) == 2_000_000
    assert time.process_time() - started < 5


def test_the_loader_refuses_what_an_upload_refuses(tmp_path):
    """The trainer reads with the same caps: a bomb is a DataError, not gigabytes."""
    pq.write_table(
        pa.table({"prompt": pa.array(["x" * (1 << 20)] * 256).dictionary_encode()}),
        tmp_path / "dict.parquet",
        compression="zstd",
    )
    (tmp_path / "deep.jsonl").write_text('{"prompt": ' + "[" * 20_000 + "]" * 20_000 + "}\n")
    (tmp_path / "keys.jsonl").write_text("".join(json.dumps({f"k{i}": 1}) + "\n" for i in range(300)))
    for name, why in [
        ("dict.parquet", "decodes to more than 67,108,864 bytes"),
        ("deep.jsonl", "row 1: JSON nested 20001 levels deep, more than 64"),
        ("keys.jsonl", "more than 256, this server's limit (dataset_max_columns)"),
    ]:
        with pytest.raises(DataError, match=f"{name}: .*{re.escape(why)}"):
            DatasetTask(path=str(tmp_path / name)).rows  # noqa: B018


def test_the_loader_reads_the_caps_the_control_plane_passes(tmp_path, monkeypatch):
    path = tmp_path / "ten.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}?", "answer": str(i)}) + "\n" for i in range(10)))
    assert len(DatasetTask(path=str(path))) == 10
    monkeypatch.setenv("TGC_DATASET_LIMITS", DataLimits(max_rows=5).to_json())
    with pytest.raises(DataError, match="more than 5 rows"):
        DatasetTask(path=str(path)).rows  # noqa: B018


def test_json_held_in_a_csv_cell_is_prescanned_before_it_is_parsed(tmp_path):
    deep = '"' + "[" * 20_000 + "]" * 20_000 + '"'
    (tmp_path / "chat.csv").write_text(f"messages,answer\n{deep},1\n")
    with pytest.raises(DataError, match=r"row 1, column 'messages': JSON nested 20000 levels deep"):
        DatasetTask(path=str(tmp_path / "chat.csv")).rows  # noqa: B018
    (tmp_path / "code.csv").write_text(f"prompt,tests,verifier\nf?,{deep},code\n")
    with pytest.raises(DataError, match=r"row 1, column 'tests': JSON nested 20000 levels deep"):
        DatasetTask(path=str(tmp_path / "code.csv")).rows  # noqa: B018


def test_jsonl_is_strict_json(tmp_path):
    for text, why in [
        ('{"prompt": "a", "answer": NaN}', "row 1: not valid JSON (NaN is not a JSON value"),
        ('{"prompt": "a", "answer": "1", "prompt": "b"}', "row 1: the key 'prompt' appears twice"),
        (
            '\ufeff{"prompt": "a", "answer": "1"}\n{"prompt": "\\ud800", "answer": "2"}',
            "row 2, column 'prompt': text that is not valid UTF-8",
        ),
    ]:
        (tmp_path / "s.jsonl").write_text(text)
        with pytest.raises(DataError, match=re.escape(why)):
            read_rows(tmp_path / "s.jsonl", "jsonl", DataLimits())


def test_csv_cells_are_text_as_written(tmp_path):
    (tmp_path / "q.csv").write_text("prompt,answer,level\nWhat is 1/2?,0.50,007\n")
    rows, columns = read_rows(tmp_path / "q.csv", "csv", DataLimits())
    assert rows == [{"prompt": "What is 1/2?", "answer": "0.50", "level": "007"}] and columns == [
        "prompt",
        "answer",
        "level",
    ]


# Hypothesis over the formats' encodings: whatever the bytes, the reader answers a shape or a DataError, and a
# file it accepts is one the task then reads
_CELL = st.one_of(
    st.text(max_size=8),
    st.binary(max_size=8).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.none(),
    st.lists(st.text(max_size=4), max_size=3),
)
_ROWS = st.lists(
    st.dictionaries(st.sampled_from(["prompt", "answer", "meta"]), _CELL, max_size=3), max_size=6
)
_ARROW_TYPES = st.sampled_from(
    [
        pa.timestamp("ms"),
        pa.timestamp("us", "UTC"),
        pa.timestamp("ns"),
        pa.date32(),
        pa.duration("ms"),
        pa.time64("us"),
    ]
)


def _write(path: Path, fmt: str, rows: list[dict], noise: bytes, ints: list[int], kind: pa.DataType) -> None:
    if fmt == "jsonl":
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        path.write_bytes(text.encode("utf-8", "surrogateescape") + noise)
    elif fmt == "csv":
        cols = sorted({k for r in rows for k in r})
        lines = [",".join(cols)] + [",".join(str(r.get(c, "")) for c in cols) for r in rows]
        path.write_bytes("\n".join(lines).encode("utf-8", "surrogateescape") + noise)
    else:
        n = max(1, len(rows))
        texts = [str(r.get("prompt", "")).encode("utf-8", "surrogateescape") for r in rows] or [b"p"]
        bits = 32 if kind in (pa.date32(),) or (pa.types.is_time(kind) and kind.bit_width == 32) else 64
        values = [v % (2 ** (bits - 1)) * (1 if v >= 0 else -1) for v in (ints * n)[:n]] if ints else [0] * n
        if pa.types.is_time(kind):
            values = [abs(v) % 86_400_000_000 for v in values]
        table = pa.table(
            {
                "prompt": pa.array(texts, pa.binary()).view(pa.string()),
                "when": pa.array(values, pa.int64() if bits == 64 else pa.int32()).cast(kind),
            }
        )
        path.write_bytes(_parquet_bytes(table, noise))


def _parquet_bytes(table: pa.Table, noise: bytes) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    body = sink.getvalue().to_pybytes()
    return body[: len(body) - len(noise)] + noise if noise else body


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fmt=st.sampled_from(["jsonl", "csv", "parquet"]),
    rows=_ROWS,
    noise=st.binary(max_size=6),
    ints=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
    kind=_ARROW_TYPES,
)
def test_any_encoding_is_a_shape_or_a_data_error_and_an_accepted_file_reads(
    tmp_path, fmt, rows, noise, ints, kind
):
    path = tmp_path / f"h.{fmt}"
    _write(path, fmt, rows, noise, ints, kind)
    try:
        shape = inspect_file(path, fmt, DataLimits())
    except DataError:
        return
    read, columns = read_rows(path, fmt, DataLimits())
    assert len(read) == shape.rows and columns == shape.columns
    json.dumps(read, default=str)  # every value converted


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"a\rb\n1\n", None),  # a lone CR ends the header row, as pyarrow reads it: columns ["a"]
        (b"a\rb,c\n", "Expected 1 columns, got 2"),  # ... so a row after it is checked against that header
        (b"a" * 200_000 + b",c\n1,2\n", "header: field larger than field limit"),  # refused by name
        (b"\xff" + b"a" * 200_000 + b"\n1\n", "a column name must be under 128 KiB"),  # not-UTF-8 branch
    ],
)
def test_a_csv_header_with_a_lone_cr_or_an_oversized_name_reads_as_pyarrow_reads_or_is_refused_by_name(
    tmp_path, header, message
):
    path = tmp_path / "h.csv"
    path.write_bytes(header)
    if message is None:
        shape = inspect_file(path, "csv", DataLimits())
        read, columns = read_rows(path, "csv", DataLimits())
        assert columns == shape.columns == ["a"] and read == [{"a": "b"}, {"a": "1"}]
    else:
        with pytest.raises(DataError, match=message):
            inspect_file(path, "csv", DataLimits())
