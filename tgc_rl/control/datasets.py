"""Datasets uploaded by tenants: the files under `<datasets_dir>/<id>/`, their records in the `datasets` table.

An upload is streamed to a staging folder (size-limited, SHA-256 as it goes), inspected by the bounded
reader in a child process with rlimits (tgc_rl/control/inspection.py: a file that cannot be read, or
would cost more than the server's caps, is refused now, naming the row and column, not when a job starts),
then moved into place and recorded. The same content uploaded again by the same tenant is the same dataset,
and nothing of the second copy stays behind, also when identical uploads race. Per-tenant quotas bound the
datasets a tenant keeps (count, bytes) and its uploads in flight; staging folders that outlive an upload (a
crash) are swept. A tenant sees, uses and deletes only its own datasets; another tenant's is a 404.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tgc_rl.bounded_read import DataError, DataLimits
from tgc_rl.control import db
from tgc_rl.control.inspection import InspectionLimits, Inspector
from tgc_rl.control.settings import ControlSettings
from tgc_rl.tasks.dataset import FORMATS

log = logging.getLogger(__name__)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_STAGING = ".staging-"


class DatasetRefused(ValueError):
    """An upload that cannot become a dataset (name, size, format or content); the message says why."""


class DatasetTooLarge(DatasetRefused):
    """The body is larger than the server's max_dataset_bytes."""


class QuotaExceeded(DatasetRefused):
    """The tenant's datasets would exceed a quota (count or bytes); the message names it."""


class TooManyUploads(DatasetRefused):
    """The tenant already has its limit of uploads in flight."""


@dataclass(frozen=True)
class UploadPolicy:
    """The operator's limits on uploads (ControlSettings' dataset_* fields); 0 turns a quota off."""

    max_bytes: int = 256 * 2**20
    quota_count: int = 100
    quota_bytes: int = 8 * 2**30
    uploads_per_tenant: int = 2
    staging_max_age_s: float = 3600.0
    inspection: InspectionLimits = field(default_factory=InspectionLimits)


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
        self.folder = root / f"{_STAGING}{self.id}"
        self.folder.mkdir(parents=True)
        self.path = self.folder / name
        self._fh = open(self.path, "wb")
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise DatasetTooLarge(
                f"the upload exceeds this server's limit of {self.max_bytes:,} bytes a dataset (max_dataset_bytes)"
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
    def __init__(self, engine: Engine, root: Path, policy: UploadPolicy | None = None):
        self.engine, self.root = engine, root
        self.policy = policy or UploadPolicy()
        self.inspector = Inspector(self.policy.inspection)
        self._lock = threading.Lock()  # quota check + insert; uploads in flight; the policy
        self._in_flight: Counter[str] = Counter()
        self._swept_at = 0.0
        self.sweep()  # start-up: what a crashed process left behind

    @contextmanager
    def uploading(self, tenant: str) -> Iterator[None]:
        """One upload in flight for the tenant (its staged bytes count against the disk until it ends).

        Quotas are checked when the content is known (`commit`): an identical upload returns the existing
        dataset even when the tenant is at its quota."""
        p = self.policy
        with self._lock:
            if p.uploads_per_tenant and self._in_flight[tenant] >= p.uploads_per_tenant:
                raise TooManyUploads(
                    f"tenant {tenant!r} already has {p.uploads_per_tenant} uploads in progress, this "
                    "server's limit (dataset_uploads_per_tenant); wait for one to finish"
                )
            self._in_flight[tenant] += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[tenant] -= 1
                if not self._in_flight[tenant]:
                    del self._in_flight[tenant]

    def begin(self, name: str) -> Upload:
        self.root.mkdir(parents=True, exist_ok=True)
        if time.time() - self._swept_at > min(600.0, self.policy.staging_max_age_s / 2):
            self.sweep()
        return Upload(self.root, name, self.policy.max_bytes)

    def commit(self, tenant: str, upload: Upload) -> tuple[DatasetRow, bool]:
        """Inspect the staged file, then record it; returns (dataset, created). The same tenant's identical
        content returns its existing dataset, and the staged copy is removed either way."""
        final = self.root / upload.id
        try:
            digest = upload.finish()
            if upload.size == 0:
                raise DatasetRefused(f"{upload.name}: the file is empty")
            existing = self._by_hash(tenant, digest)
            if existing is not None:
                return existing, False
            self._check_quota(tenant, upload.size)
            inspector = self.inspector
            with inspector.slot():
                existing = self._by_hash(tenant, digest)  # an identical upload that had the slot first
                if existing is not None:
                    return existing, False
                try:
                    shape = inspector.inspect(upload.path, upload.format, upload.name)
                except DataError as e:
                    raise DatasetRefused(str(e)) from None
            row = DatasetRow(
                upload.id,
                tenant,
                upload.name,
                upload.format,
                upload.size,
                digest,
                shape.rows,
                shape.columns,
                time.time(),
            )
            upload.folder.rename(final)
            with self._lock:
                existing = self._by_hash(tenant, digest)  # an identical upload committed meanwhile
                if existing is None:
                    self._check_quota(tenant, upload.size)
                    try:
                        with self.engine.begin() as conn:
                            conn.execute(
                                db.datasets.insert().values(
                                    id=row.id,
                                    tenant=tenant,
                                    name=row.name,
                                    format=row.format,
                                    size_bytes=row.size_bytes,
                                    sha256=digest,
                                    rows=row.rows,
                                    columns=json.dumps(row.columns),
                                    created_at=row.created_at,
                                )
                            )
                    except sa.exc.IntegrityError:  # another replica's identical upload won the race
                        existing = self._by_hash(tenant, digest)
                        if existing is None:
                            raise
            if existing is not None:
                shutil.rmtree(final, ignore_errors=True)
                return existing, False
            return row, True
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise
        finally:
            upload.discard()

    def _usage(self, tenant: str) -> tuple[int, int]:
        """(datasets, bytes) the tenant keeps."""
        with self.engine.connect() as conn:
            count, used = conn.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(db.datasets.c.size_bytes), 0)).where(
                    db.datasets.c.tenant == tenant
                )
            ).one()
        return int(count), int(used)

    def _check_quota(self, tenant: str, size: int) -> None:
        p = self.policy
        if not (p.quota_count or p.quota_bytes):
            return
        count, used = self._usage(tenant)
        if p.quota_count and count >= p.quota_count:
            raise QuotaExceeded(
                f"tenant {tenant!r} keeps {count} datasets, its quota (dataset_quota_count is "
                f"{p.quota_count}); delete datasets it no longer needs"
            )
        if p.quota_bytes and used + size > p.quota_bytes:
            raise QuotaExceeded(
                f"tenant {tenant!r} keeps {used:,} bytes of datasets; this upload's {size:,} would pass its quota "
                f"of {p.quota_bytes:,} bytes (dataset_quota_bytes); delete datasets it no longer needs"
            )

    def sweep(self) -> int:
        """Removes staging folders, and dataset folders without a record, untouched for staging_max_age_s
        (what a crash mid-upload leaves); returns how many."""
        self._swept_at = time.time()
        if not self.root.is_dir():
            return 0
        cutoff = self._swept_at - self.policy.staging_max_age_s
        folders = [f for f in self.root.iterdir() if f.is_dir() and f.name.startswith((_STAGING, "ds_"))]
        stale = [f for f in folders if _last_touched(f) < cutoff]
        if not stale:
            return 0
        with self.engine.connect() as conn:
            recorded = set(
                conn.execute(
                    sa.select(db.datasets.c.id).where(db.datasets.c.id.in_([f.name for f in stale]))
                ).scalars()
            )
        removed = 0
        for f in stale:
            if f.name not in recorded:
                shutil.rmtree(f, ignore_errors=True)
                removed += 1
        if removed:
            log.info("removed %d stale upload folder(s) under %s", removed, self.root)
        return removed

    def _by_hash(self, tenant: str, digest: str) -> DatasetRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(
                sa.select(db.datasets).where(db.datasets.c.tenant == tenant, db.datasets.c.sha256 == digest)
            ).first()
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


def _last_touched(folder: Path) -> float:
    """The newest modification time of a folder and its files (a staging file grows while it uploads)."""
    try:
        return max([folder.stat().st_mtime, *(f.stat().st_mtime for f in folder.iterdir())])
    except OSError:  # removed meanwhile
        return time.time()


def data_limits(settings: ControlSettings) -> DataLimits:
    """The caps on one data file: checked at upload, and passed to jobs (their loader checks the same)."""
    s = settings
    return DataLimits(
        max_rows=s.dataset_max_rows,
        max_columns=s.dataset_max_columns,
        max_decoded_bytes=s.dataset_max_decoded_bytes,
        max_expansion=s.dataset_max_expansion,
    )


def upload_policy(settings: ControlSettings) -> UploadPolicy:
    """The server's dataset_* settings as the store's policy."""
    s = settings
    return UploadPolicy(
        max_bytes=s.max_dataset_bytes,
        quota_count=s.dataset_quota_count,
        quota_bytes=s.dataset_quota_bytes,
        uploads_per_tenant=s.dataset_uploads_per_tenant,
        staging_max_age_s=s.dataset_staging_max_age_s,
        inspection=InspectionLimits(
            data_limits(s),
            s.dataset_inspect_cpu_s,
            s.dataset_inspect_memory_mb,
            s.dataset_inspect_concurrency,
            s.dataset_inspect_queue_s,
        ),
    )
