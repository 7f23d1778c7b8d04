"""Datasets uploaded by tenants: the files under `<datasets_dir>/<id>/`, their records in the `datasets` table.

An upload is streamed to a staging file (size-limited, SHA-256 as it goes), read once by the same loader the
`dataset` task uses (a file that cannot be read is refused now, naming the row, not when a job starts), then
moved into place and recorded. The same content uploaded again by the same tenant is the same dataset. A
tenant sees, uses and deletes only its own datasets; another tenant's is a 404.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from services.control import db
from services.tasks.dataset import FORMATS, DataError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class DatasetRefused(ValueError):
    """An upload that cannot become a dataset (name, size, format or content); the message says why."""


@dataclass(frozen=True)
class DatasetRow:
    id: str
    tenant: str
    name: str
    format: str
    size_bytes: int
    sha256: str
    rows: int
    columns: list[str]
    created_at: float

    @classmethod
    def from_row(cls, r: sa.Row) -> DatasetRow:
        return cls(
            r.id,
            r.tenant,
            r.name,
            r.format,
            r.size_bytes,
            r.sha256,
            r.rows,
            json.loads(r.columns),
            r.created_at,
        )


def check_name(name: str) -> str:
    """A file name for an upload: plain characters, a known suffix (it decides the format)."""
    if not _NAME.fullmatch(name):
        raise DatasetRefused(
            f"name {name!r}: use 1-128 letters, digits, '.', '_' or '-' (a file name, no path)"
        )
    fmt = FORMATS.get(Path(name).suffix.lower())
    if fmt is None:
        raise DatasetRefused(
            f"name {name!r}: end it in .jsonl, .json, .parquet or .csv (the suffix is the format)"
        )
    return fmt


class Upload:
    """A staging file that bytes are appended to, with a running size limit and hash."""

    def __init__(self, root: Path, name: str, max_bytes: int):
        self.format = check_name(name)
        self.name, self.max_bytes = name, max_bytes
        self.id = "ds_" + secrets.token_hex(16)
        self.folder = root / f".staging-{self.id}"
        self.folder.mkdir(parents=True)
        self.path = self.folder / name
        self._fh = open(self.path, "wb")
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise DatasetRefused(
                f"the upload exceeds this server's limit of {self.max_bytes:,} bytes a dataset"
            )
        self._hash.update(chunk)
        self._fh.write(chunk)

    def finish(self) -> str:
        self._fh.close()
        return self._hash.hexdigest()

    def discard(self) -> None:
        self._fh.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class DatasetStore:
    def __init__(self, engine: Engine, root: Path):
        self.engine, self.root = engine, root

    def begin(self, name: str, max_bytes: int) -> Upload:
        self.root.mkdir(parents=True, exist_ok=True)
        return Upload(self.root, name, max_bytes)

    def commit(self, tenant: str, upload: Upload) -> tuple[DatasetRow, bool]:
        """Check the staged file, then record it; returns (dataset, created). The same tenant's identical
        content returns its existing dataset."""
        try:
            digest = upload.finish()
            if upload.size == 0:
                raise DatasetRefused(f"{upload.name}: the file is empty")
            existing = self._by_hash(tenant, digest)
            if existing is not None:
                return existing, False
            rows, columns = inspect_file(upload.path, upload.name)
            final = self.root / upload.id
            os.replace(upload.folder, final)
        except BaseException:
            upload.discard()
            raise
        row = DatasetRow(
            upload.id, tenant, upload.name, upload.format, upload.size, digest, rows, columns, time.time()
        )
        with self.engine.begin() as conn:
            conn.execute(db.datasets.insert().values(
                id=row.id, tenant=tenant, name=row.name, format=row.format, size_bytes=row.size_bytes,
                sha256=digest, rows=rows, columns=json.dumps(columns), created_at=row.created_at))  # fmt: skip
        return row, True

    def _by_hash(self, tenant: str, digest: str) -> DatasetRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(sa.select(db.datasets).where(
                db.datasets.c.tenant == tenant, db.datasets.c.sha256 == digest)).first()  # fmt: skip
        return DatasetRow.from_row(r) if r is not None else None

    def get(self, dataset_id: str, tenant: str | None) -> DatasetRow | None:
        """The dataset, if `tenant` owns it (None: any tenant's, for admins)."""
        query = sa.select(db.datasets).where(db.datasets.c.id == dataset_id)
        if tenant is not None:
            query = query.where(db.datasets.c.tenant == tenant)
        with self.engine.connect() as conn:
            r = conn.execute(query).first()
        return DatasetRow.from_row(r) if r is not None else None

    def list(self, tenant: str | None) -> list[DatasetRow]:
        query = sa.select(db.datasets).order_by(db.datasets.c.created_at.desc())
        if tenant is not None:
            query = query.where(db.datasets.c.tenant == tenant)
        with self.engine.connect() as conn:
            return [DatasetRow.from_row(r) for r in conn.execute(query)]

    def delete(self, dataset_id: str, tenant: str | None) -> bool:
        row = self.get(dataset_id, tenant)
        if row is None:
            return False
        with self.engine.begin() as conn:
            conn.execute(db.datasets.delete().where(db.datasets.c.id == row.id))
        shutil.rmtree(self.root / row.id, ignore_errors=True)
        return True


def inspect_file(path: Path, name: str) -> tuple[int, list[str]]:
    """(rows, columns) of an uploaded file, read by the `dataset` task's own loader."""
    from services.tasks.dataset import read_table
    from services.tasks.params import DatasetParams

    try:
        rows, columns, _ = read_table(DatasetParams(path=str(path)))
    except DataError as e:
        raise DatasetRefused(str(e).replace(str(path), name)) from None
    return len(rows), columns
