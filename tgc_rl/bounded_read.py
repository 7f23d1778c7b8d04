"""Reading a data file within fixed bounds, whatever its encoding: the one reader of uploaded and task files.

A file's cost is bounded before and while it is decoded, never after:
- JSON text (JSONL rows, JSON held in CSV cells) is pre-scanned, linearly and without a parser, for nesting
  deeper than `MAX_DEPTH`; a parser sees only rows that pass (a JSON parser recurses per level).
- JSONL is read a line at a time; Parquet's footer (rows, columns, uncompressed sizes) is checked before any
  page is decoded, then its pages are read in batches with dictionaries kept encoded, so a tiny file that
  names one long string many times is measured, not expanded; CSV is read in fixed-size blocks.
- Caps (`DataLimits`): rows, columns (JSONL: distinct keys), decoded bytes (also relative to the file's
  size), characters of one text value. CSV and Parquet values are checked and measured as Arrow arrays, never
  turned into Python objects to be counted; a JSONL row is parsed alone and dropped.
- Every value that would not convert (invalid UTF-8, a timestamp outside Python's years 1-9999, ...) is
  refused with its row and column, so the rows a job reads later convert.

`inspect_file` is what the control plane runs on an upload (in a child process with rlimits:
tgc_rl/control/inspection.py); `read_rows` is what the `dataset` task loads, after the same checks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

MAX_DEPTH = 64  # a dataset row needs a handful of levels (row, messages, message); this is far more
MAX_CELL_CHARS = 1 << 20  # a text value longer than this is refused, not truncated
MAX_LINE_BYTES = 64 * MAX_CELL_CHARS  # a JSONL row longer than this is refused before it is read whole
MAX_COLUMN_NAME = 256  # characters of a column name
EXPANSION_FLOOR = 64 << 20  # any file may decode to this much, however small it is
CSV_BLOCK_BYTES = 16 << 20  # CSV is parsed in blocks of this size (a row must fit in one)
CELL_OVERHEAD = 8  # bytes charged for every cell on top of its text: the table's offsets and pointers
LIMITS_ENV = "TGC_DATASET_LIMITS"  # JSON of DataLimits fields: how the control plane passes its caps on


class DataError(ValueError):
    """A dataset file or row is unusable; the message names the file, row and column and what to do."""


@dataclass(frozen=True)
class DataLimits:
    """Caps on what one data file may decode to (the control plane's dataset_* settings)."""

    max_rows: int = 1_000_000
    max_columns: int = 256
    max_decoded_bytes: int = 1 << 30
    max_expansion: int = 64  # decoded bytes per byte of the file, beyond EXPANSION_FLOOR
    max_cell_chars: int = MAX_CELL_CHARS

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"dataset limit {f.name}={value!r}: must be a positive integer")

    def decoded_cap(self, file_bytes: int) -> int:
        return min(self.max_decoded_bytes, max(EXPANSION_FLOOR, self.max_expansion * file_bytes))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> DataLimits:
        raw = os.environ.get(LIMITS_ENV)
        return cls(**json.loads(raw)) if raw else cls()


@dataclass(frozen=True)
class TableShape:
    """What inspection found: the rows and columns a job will see, and the table's decoded size."""

    rows: int
    columns: list[str]
    decoded_bytes: int


# -- nesting, before any parser ------------------------------------------------------------------------
_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b'[]{}"')
_SCAN_BLOCK = 1 << 22


def nesting_depth(data: bytes, at_most: int | None = None) -> int:
    """The deepest `[`/`{` nesting of JSON text, in one linear pass with no parser (strings skipped).

    Escapes are removed first (`\\\\` pairs, then `\\"`), so every remaining quote opens or closes a string;
    for valid JSON the result is exact, and invalid JSON is refused by the parser afterwards anyway.
    """
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = data.translate(None, _NOT_STRUCTURAL)
    if len(marks) <= 1 or (at_most is not None and marks.count(b"[") + marks.count(b"{") <= at_most):
        return 0
    import numpy as np

    deepest, depth, quotes = 0, 0, 0
    for start in range(0, len(marks), _SCAN_BLOCK):  # blocks keep the scan's memory fixed
        a = np.frombuffer(marks, dtype=np.uint8, count=min(_SCAN_BLOCK, len(marks) - start), offset=start)
        q = a == 0x22  # '"'
        inside = ((np.cumsum(q, dtype=np.int64) + quotes) & 1).astype(bool)
        step = ((a == 0x5B) | (a == 0x7B)).astype(np.int32) - ((a == 0x5D) | (a == 0x7D)).astype(np.int32)
        step[inside | q] = 0
        level = np.cumsum(step, dtype=np.int64) + depth
        deepest = max(deepest, int(level.max()))
        depth, quotes = int(level[-1]), quotes + int(q.sum())
    return deepest


def check_nesting(data: bytes, where: str) -> None:
    depth = nesting_depth(data, at_most=MAX_DEPTH)
    if depth > MAX_DEPTH:
        raise DataError(
            f"{where}: JSON nested {depth} levels deep, more than {MAX_DEPTH}; a dataset row needs a few "
            "(row, list, message): flatten it"
        )


def loads_bounded(text: str, where: str) -> Any:
    """json.loads of a text cell (messages or tests held as JSON text), after the nesting pre-scan."""
    check_nesting(text.encode("utf-8", "surrogatepass"), where)
    return json.loads(text)


# -- text values -----------------------------------------------------------------------------------------
def _bad_text(value: str) -> bool:
    """True if the text holds lone surrogates (invalid UTF-8 read with surrogateescape, or a `\\ud800` escape)."""
    if value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_text(v: str, where: str, limits: DataLimits) -> None:
    if len(v) > limits.max_cell_chars:
        raise DataError(
            f"{where}: a text of {len(v):,} characters, more than {limits.max_cell_chars:,}; shorten it"
        )
    if _bad_text(v):
        raise DataError(f"{where}: text that is not valid UTF-8; save the file as UTF-8")


def _check_value(value: Any, where: str, limits: DataLimits) -> int:
    """Walks a JSON value iteratively: every text within the cell limit and valid; returns its decoded size
    (text characters plus CELL_OVERHEAD per list item or object member)."""
    if isinstance(value, str):
        _check_text(value, where, limits)
        return len(value)
    if not isinstance(value, list | dict):
        return 0
    size, stack = 0, [value]
    while stack:
        items = stack.pop()
        if type(items) is dict:
            items = list(items.values())
        size += CELL_OVERHEAD * len(items)
        for v in items:  # one type test per item: a list of 20 million numbers stays cheap
            t = type(v)
            if t is str:
                _check_text(v, where, limits)
                size += len(v)
            elif t is list or t is dict:
                stack.append(v)
    return size


def _check_column_name(name: str, where: str) -> None:
    if len(name) > MAX_COLUMN_NAME:
        raise DataError(f"{where}: a column name of {len(name):,} characters; use at most {MAX_COLUMN_NAME}")
    if _bad_text(name):
        raise DataError(f"{where}: a column name that is not valid UTF-8; save the file as UTF-8")


# -- JSON Lines -------------------------------------------------------------------------------------------
_KINDS = {bool: "boolean", int: "number", float: "number", str: "string", list: "list", dict: "object"}


def _json_kind(value: Any) -> str:
    return _KINDS.get(type(value), "null")


def _lines(fh: Any, label: str) -> Iterator[bytes]:
    """Lines of a binary file, refusing one longer than MAX_LINE_BYTES before it is read whole."""
    number = 0
    while True:
        line = fh.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            raise DataError(
                f"{label}: row {number}: longer than {MAX_LINE_BYTES >> 20} MiB; split it or shorten its cells"
            )
        yield line


class _DuplicateKey(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))  # type: ignore[func-returns-value]
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value; write it as text or null")


# a duplicate key would silently keep one value; NaN and Infinity are Python's extension, not JSON
_DECODER = json.JSONDecoder(object_pairs_hook=_unique_pairs, parse_constant=_no_constant)


def _decode_row(line: bytes, where: str) -> dict[str, Any]:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        # name the column: read the row with the bad bytes kept as surrogates and find the text that holds them
        text = line.decode("utf-8", "surrogateescape")
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, dict):
            for column, cell in value.items():
                if _bad_text(column):
                    break
                try:
                    _check_value(cell, "", DataLimits(max_cell_chars=1 << 62))
                except DataError:
                    raise DataError(
                        f"{where}, column {column!r}: text that is not valid UTF-8 (byte {e.object[e.start]:#04x}"
                        "); save the file as UTF-8"
                    ) from None
        raise DataError(
            f"{where}: not valid UTF-8 (byte {e.object[e.start]:#04x} at offset {e.start}); save the file as "
            "UTF-8"
        ) from None
    try:
        value = _DECODER.decode(text)
    except _DuplicateKey as e:
        raise DataError(f"{where}: the key {e.args[0]!r} appears twice in one object; keep one") from None
    except ValueError as e:
        raise DataError(f"{where}: not valid JSON ({e}); each line must be one JSON object") from None
    if not isinstance(value, dict):
        raise DataError(
            f"{where}: a JSON {_json_kind(value)}, not an object; each line must be one object such as "
            '{"prompt": ..., "answer": ...}'
        )
    return value


class _Tally:
    """Running totals of one file against its caps."""

    def __init__(self, label: str, limits: DataLimits, file_bytes: int):
        self.label, self.limits, self.file_bytes = label, limits, file_bytes
        self.cap = limits.decoded_cap(file_bytes)
        self.rows = self.decoded = 0

    def add(self, rows: int, decoded: int) -> None:
        self.rows += rows
        self.decoded += decoded
        if self.rows > self.limits.max_rows:
            raise DataError(
                f"{self.label}: more than {self.limits.max_rows:,} rows, this server's limit "
                "(dataset_max_rows); split the file"
            )
        self.check_decoded(self.decoded)

    def check_decoded(self, decoded: int, what: str = "decodes to") -> None:
        if decoded > self.cap:
            raise DataError(
                f"{self.label}: {what} more than {self.cap:,} bytes (from {self.file_bytes:,} bytes of file); "
                f"this server's limit is the larger of {EXPANSION_FLOOR >> 20} MiB and "
                f"{self.limits.max_expansion}x the file, at most {self.limits.max_decoded_bytes:,} bytes "
                "(dataset_max_expansion, dataset_max_decoded_bytes); split the file"
            )

    def columns(self, names: list[str], where: str) -> None:
        if not names:
            raise DataError(f"{where}: no columns; rows need a prompt and an answer")
        if len(names) > self.limits.max_columns:
            raise DataError(
                f"{where}: {len(names):,} columns, more than {self.limits.max_columns}, this server's limit "
                "(dataset_max_columns); keep the columns a job reads"
            )
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise DataError(f"{where}: the column {name!r} appears twice; rename one")
            seen.add(name)
            _check_column_name(name, where)


class _Scan:
    """One bounded pass over a file. `batches()` yields row chunks as Arrow record batches (CSV, Parquet) or
    lists of row dicts (JSONL), each already checked; `columns` is complete once the pass ends."""

    def __init__(self, path: Path, fmt: str, limits: DataLimits, label: str):
        self.path, self.fmt, self.limits, self.label = path, fmt, limits, label
        self.tally = _Tally(label, limits, path.stat().st_size)
        self.columns: list[str] = []

    def batches(self) -> Iterator[Any]:
        if self.fmt == "jsonl":
            yield from self._jsonl()
        elif self.fmt == "csv":
            yield from self._csv()
        elif self.fmt == "parquet":
            yield from self._parquet()
        else:
            raise DataError(f"{self.label}: format {self.fmt!r} is not one of jsonl, csv, parquet")
        if self.tally.rows == 0:
            alone = " (a header alone); add at least one row" if self.fmt == "csv" else ""
            blank = " (the file holds only blank lines)" if self.fmt == "jsonl" else ""
            raise DataError(f"{self.label}: no rows{alone or blank}")
        if not self.columns:
            raise DataError(
                f"{self.label}: no columns (every row is an empty object); rows need a prompt and an answer"
            )

    # JSON Lines: a line at a time
    def _jsonl(self) -> Iterator[list[dict[str, Any]]]:
        kinds: dict[str, tuple[str, int]] = {}
        chunk: list[dict[str, Any]] = []
        with open(self.path, "rb") as fh:
            for number, line in enumerate(_lines(fh, self.label), 1):
                if number == 1 and line.startswith(b"\xef\xbb\xbf"):
                    line = line[3:]  # a UTF-8 byte-order mark
                if not line.strip():
                    continue
                where = f"{self.label}: row {number}"
                check_nesting(line, where)
                row = _decode_row(line, where)
                decoded = 0
                for column, cell in row.items():
                    if column not in kinds:
                        _check_column_name(column, f"{where}, column {column[:64]!r}")
                        if len(kinds) + 1 > self.limits.max_columns:
                            raise DataError(
                                f"{where}: its column {column[:64]!r} is the file's {len(kinds) + 1}th, more than "
                                f"{self.limits.max_columns}, this server's limit (dataset_max_columns); keep the "
                                "columns a job reads"
                            )
                        kinds[column] = ("null", number)
                        self.columns.append(column)
                    kind, (first, at) = _json_kind(cell), kinds[column]
                    if kind != "null":
                        if first == "null":
                            kinds[column] = (kind, number)
                        elif first != kind:
                            raise DataError(
                                f"{where}, column {column!r}: a {kind}, but row {at} has a {first}; every row "
                                "must give a column the same type (e.g. quote numbers as text)"
                            )
                    decoded += CELL_OVERHEAD + _check_value(cell, f"{where}, column {column!r}", self.limits)
                self.tally.add(1, decoded)
                chunk.append(row)
                if len(chunk) >= 1024:
                    yield chunk
                    chunk = []
        if chunk:
            yield chunk

    # CSV: every cell is text, parsed in fixed-size blocks
    def _csv(self) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.csv as pcsv

        names = self._csv_header()
        try:
            reader = pcsv.open_csv(
                self.path,
                read_options=pcsv.ReadOptions(block_size=CSV_BLOCK_BYTES, use_threads=False),
                convert_options=pcsv.ConvertOptions(
                    column_types={n: pa.binary() for n in names}, strings_can_be_null=False, check_utf8=False
                ),
            )
            for batch in reader:  # a row with too many or too few cells: pyarrow names it ("Row #3: ...")
                batch = pa.RecordBatch.from_arrays(
                    [self._csv_text(col, name) for col, name in zip(batch.columns, names, strict=True)],
                    names=names,
                )
                self._checked(batch)
                yield batch
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
            raise DataError(f"{self.label}: not a readable CSV file: {_arrow_message(e)}") from None

    def _csv_header(self) -> list[str]:
        import csv

        with open(self.path, "rb") as fh:
            line = fh.readline(CSV_BLOCK_BYTES + 1)
        if len(line) > CSV_BLOCK_BYTES:
            raise DataError(f"{self.label}: header: longer than {CSV_BLOCK_BYTES >> 20} MiB")
        # The header ends where pyarrow's first row does: at the first CR or LF (a lone CR ends a row there too).
        line = line.removeprefix(b"\xef\xbb\xbf").replace(b"\r", b"\n", 1).split(b"\n", 1)[0]

        def cells(text: str) -> list[str]:
            try:
                return next(csv.reader([text]), [])
            except csv.Error as e:  # a name over the csv module's field limit (128 KiB)
                raise DataError(f"{self.label}: header: {e}; a column name must be under 128 KiB") from None

        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            names = cells(line.decode("utf-8", "surrogateescape"))
            k = next((i for i, n in enumerate(names) if _bad_text(n)), 0)
            raise DataError(
                f"{self.label}: header, column {k + 1}: a name that is not valid UTF-8; save the file as UTF-8"
            ) from None
        names = cells(text) if text.strip() else []
        self.tally.columns(names, f"{self.label}: header")  # before pyarrow builds a column per name
        self.columns = names
        return names

    def _csv_text(self, col: pa.Array, name: str) -> pa.Array:
        import pyarrow as pa

        try:
            return col.cast(pa.string())
        except pa.ArrowInvalid:
            for i, value in enumerate(col.to_pylist()):
                try:
                    value.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(
                        f"{self.label}: row {self.tally.rows + i + 1}, column {name!r}: text that is not valid "
                        f"UTF-8 (byte {value[e.start]:#04x}); save the file as UTF-8"
                    ) from None
            raise

    # Parquet: the footer first, then batches with dictionaries kept encoded
    def _parquet(self) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            meta = pq.ParquetFile(self.path).metadata
            schema = meta.schema
            leaves = [schema.column(i) for i in range(meta.num_columns)]
            arrow_schema = schema.to_arrow_schema()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
            raise DataError(f"{self.label}: not a readable PARQUET file: {_arrow_message(e)}") from None
        names = list(arrow_schema.names)
        self.tally.columns(names, self.label)
        if len(leaves) > self.limits.max_columns:
            self.tally.columns([str(i) for i in range(len(leaves))], f"{self.label} (nested fields counted)")
        for field in arrow_schema:
            if _type_depth(field.type) > MAX_DEPTH:
                raise DataError(
                    f"{self.label}, column {field.name!r}: nested more than {MAX_DEPTH} levels deep"
                )
        if meta.num_rows > self.limits.max_rows:
            self.tally.add(meta.num_rows, 0)
        uncompressed = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
        self.tally.check_decoded(
            uncompressed + CELL_OVERHEAD * meta.num_rows * len(names), "its footer says it decodes to"
        )
        self.columns = names
        texts = [c.path for c in leaves if c.physical_type == "BYTE_ARRAY"]
        per_row = max(1, uncompressed // max(1, meta.num_rows))
        batch_rows = max(64, min(65_536, (32 << 20) // per_row))
        try:
            reader = pq.ParquetFile(self.path, read_dictionary=texts)
            for batch in reader.iter_batches(batch_size=batch_rows, use_threads=False):
                self._checked(batch)
                yield batch
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
            raise DataError(f"{self.label}: not a readable PARQUET file: {_arrow_message(e)}") from None

    def _checked(self, batch: pa.RecordBatch) -> None:
        """Counts a batch against the caps, then checks that every value will convert (row and column named)."""
        first = self.tally.rows
        self.tally.add(
            batch.num_rows,
            sum(_decoded_size(c) for c in batch.columns) + CELL_OVERHEAD * batch.num_rows * batch.num_columns,
        )
        for name, col in zip(batch.schema.names, batch.columns, strict=True):
            problem = _value_problem(col, self.limits)
            if problem is not None:
                row = _locate(col, self.limits)
                at = f"row {first + row + 1}, " if row is not None else ""
                raise DataError(f"{self.label}: {at}column {name!r}: {problem}")


def _type_depth(t: pa.DataType) -> int:
    deepest, stack = 0, [(t, 1)]
    while stack:
        t, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((t.field(i).type, d + 1) for i in range(t.num_fields))
    return deepest


def _is_text(t: pa.DataType) -> bool:
    import pyarrow.types as pt

    return pt.is_string(t) or pt.is_large_string(t) or pt.is_string_view(t)


def _is_bytes(t: pa.DataType) -> bool:
    import pyarrow.types as pt

    return pt.is_binary(t) or pt.is_large_binary(t) or pt.is_fixed_size_binary(t) or pt.is_binary_view(t)


def _children(arr: pa.Array) -> list[pa.Array]:
    import pyarrow.types as pt

    t = arr.type
    if pt.is_struct(t):
        return list(arr.flatten())
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t) or pt.is_map(t) or pt.is_list_view(t):
        return [arr.flatten()]
    return []


def _decoded_size(arr: pa.Array) -> int:
    """Bytes of the array once its dictionaries are expanded (what a reader of every value would hold)."""
    import pyarrow.compute as pc
    import pyarrow.types as pt

    if pt.is_dictionary(arr.type):
        values = arr.dictionary
        if _is_text(values.type) or _is_bytes(values.type):
            total = pc.sum(pc.take(pc.binary_length(values), arr.indices)).as_py() or 0
            return int(total) + arr.indices.nbytes
        return arr.indices.nbytes * max(1, values.nbytes // max(1, len(values)))
    children = _children(arr)
    if children:
        return sum(_decoded_size(c) for c in children) + CELL_OVERHEAD * len(arr)
    return arr.nbytes


def _value_problem(arr: pa.Array, limits: DataLimits) -> str | None:
    """Why some value of the column would not make a usable cell, found without converting each value."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.types as pt

    try:
        arr.validate(full=True)  # includes UTF-8 of every string, nested or in a dictionary
    except pa.ArrowInvalid as e:
        if "UTF8" in str(e) or "utf8" in str(e).lower():
            return "text that is not valid UTF-8; save the file as UTF-8"
        return f"malformed data ({_arrow_message(e)})"
    stack = [arr]
    while stack:
        a = stack.pop()
        t = a.type
        if pt.is_dictionary(t):
            lengths = _lengths(a.dictionary)
            if (
                lengths is not None
                and len(a)
                and (pc.max(pc.take(lengths, a.indices)).as_py() or 0) > limits.max_cell_chars
            ):
                return f"a value longer than {limits.max_cell_chars:,} characters; shorten it"
            if lengths is None:
                stack.append(a.dictionary)
            continue
        lengths = _lengths(a)
        if lengths is not None:
            if len(a) and (pc.max(lengths).as_py() or 0) > limits.max_cell_chars:
                return f"a value longer than {limits.max_cell_chars:,} characters; shorten it"
            continue
        children = _children(a)
        if children:
            stack.extend(children)
            continue
        if pt.is_integer(t) or pt.is_floating(t) or pt.is_boolean(t) or pt.is_null(t):
            continue
        try:  # temporal, decimal and other types: convert this batch's values to find ones Python cannot hold
            a.to_pylist()
        except (ValueError, OverflowError, TypeError, pa.ArrowException) as e:
            return f"a value that cannot be read ({type(e).__name__}: {str(e)[:200]}); write it as text"
    return None


def _lengths(arr: pa.Array) -> pa.Array | None:
    import pyarrow.compute as pc

    if _is_text(arr.type):
        return pc.utf8_length(arr)
    if _is_bytes(arr.type):
        return pc.binary_length(arr)
    return None


def _locate(col: pa.Array, limits: DataLimits) -> int | None:
    """The first row of a (bounded) batch whose value fails to convert or check, converting one row at a time."""
    for i in range(len(col)):
        try:
            value = col[i].as_py()
            _check_value(value, "", limits)
        except (DataError, ValueError, OverflowError, TypeError, UnicodeDecodeError):
            return i
        except Exception:  # any other conversion failure is this row's too
            return i
    return None


def _arrow_message(e: Exception) -> str:
    return str(e).strip().splitlines()[0][:500] if str(e).strip() else type(e).__name__


# -- the two uses ----------------------------------------------------------------------------------------
def inspect_file(path: Path, fmt: str, limits: DataLimits, label: str | None = None) -> TableShape:
    """Rows, columns and decoded size of a file after every check, holding one batch at a time."""
    scan = _Scan(path, fmt, limits, label or str(path))
    for _ in scan.batches():
        pass
    return TableShape(scan.tally.rows, scan.columns, scan.tally.decoded)


def read_rows(
    path: Path, fmt: str, limits: DataLimits, label: str | None = None, max_rows: int | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows (at most `max_rows`) and columns of a file, read with the same checks as `inspect_file`."""
    scan = _Scan(path, fmt, limits, label or str(path))
    rows: list[dict[str, Any]] = []
    for batch in scan.batches():
        if max_rows is not None and len(rows) >= max_rows:
            continue  # the rest is still checked: a job reads what an upload accepted
        rows.extend(batch if isinstance(batch, list) else batch.to_pylist())
    return rows[:max_rows] if max_rows is not None else rows, scan.columns
