"""Bearer tokens: minted at random, stored only as SHA-256 digests, each owned by a tenant.

Why SHA-256 and not a slow password hash: the tokens are 256-bit random strings, so a fast digest
cannot be brute-forced, and every request can look its token up by digest with one indexed query.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tgc_rl.control import db

USER_PREFIX = "tgc_"
JOB_PREFIX = "tgcj_"
TENANT_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")  # fullmatch: `$` would accept a trailing newline


def mint(prefix: str = USER_PREFIX) -> str:
    return prefix + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant, possibly with admin rights over all tenants."""

    tenant: str
    is_admin: bool
    token_id: str


@dataclass(frozen=True)
class TokenInfo:
    id: str
    tenant: str
    name: str
    is_admin: bool
    created_at: float
    revoked_at: float | None


class TokenStore:
    def __init__(self, engine: Engine):
        self.engine = engine

    def create(self, tenant: str, name: str = "", is_admin: bool = False) -> tuple[TokenInfo, str]:
        """Create a token; returns its record and the secret, which is shown once and never stored."""
        if not TENANT_PATTERN.fullmatch(tenant):
            raise ValueError(
                f"tenant {tenant!r} is not a valid tenant name: use 1-64 lowercase letters, digits, '-' or '_', "
                "starting with a letter or digit"
            )
        secret = mint()
        info = TokenInfo(
            id="tok_" + secrets.token_hex(8),
            tenant=tenant,
            name=name[:128],
            is_admin=is_admin,
            created_at=time.time(),
            revoked_at=None,
        )
        with self.engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn, conn.begin():
            self._ensure_tenant(conn, tenant)
            conn.execute(
                db.tokens.insert().values(
                    id=info.id,
                    tenant=tenant,
                    name=info.name,
                    is_admin=is_admin,
                    token_hash=digest(secret),
                    created_at=info.created_at,
                    revoked_at=None,
                )
            )
        return info, secret

    def authenticate(self, secret: str) -> Principal | None:
        if not secret.startswith(USER_PREFIX):
            return None
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(db.tokens).where(
                    db.tokens.c.token_hash == digest(secret), db.tokens.c.revoked_at.is_(None)
                )
            ).first()
        return None if row is None else Principal(row.tenant, bool(row.is_admin), row.id)

    def is_active(self, token_id: str) -> bool:
        """Whether the token still exists unrevoked (what an open event stream checks now and then)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(db.tokens.c.id).where(db.tokens.c.id == token_id, db.tokens.c.revoked_at.is_(None))
            ).first()
        return row is not None

    def list(self, tenant: str | None = None) -> list[TokenInfo]:
        query = sa.select(db.tokens).order_by(db.tokens.c.created_at)
        if tenant is not None:
            query = query.where(db.tokens.c.tenant == tenant)
        with self.engine.connect() as conn:
            return [
                TokenInfo(r.id, r.tenant, r.name, bool(r.is_admin), r.created_at, r.revoked_at)
                for r in conn.execute(query)
            ]

    def revoke(self, token_id: str) -> bool:
        with self.engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn, conn.begin():
            res = conn.execute(
                db.tokens.update()
                .where(db.tokens.c.id == token_id, db.tokens.c.revoked_at.is_(None))
                .values(revoked_at=time.time())
            )
        return res.rowcount == 1

    # -- tenants ----------------------------------------------------------------------------------
    def set_quota(self, tenant: str, max_concurrent_jobs: int | None) -> None:
        """Per-tenant limit on starting+running jobs (None: the server default)."""
        if max_concurrent_jobs is not None and max_concurrent_jobs < 0:
            raise ValueError("max_concurrent_jobs must be >= 0 (0 pauses the tenant: its jobs stay queued)")
        with self.engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn, conn.begin():
            self._ensure_tenant(conn, tenant)
            conn.execute(
                db.tenants.update()
                .where(db.tenants.c.name == tenant)
                .values(max_concurrent_jobs=max_concurrent_jobs)
            )

    def quota(self, tenant: str) -> int | None:
        with self.engine.connect() as conn:
            return conn.execute(
                sa.select(db.tenants.c.max_concurrent_jobs).where(db.tenants.c.name == tenant)
            ).scalar_one_or_none()

    @staticmethod
    def _ensure_tenant(conn: sa.Connection, tenant: str) -> None:
        exists = conn.execute(sa.select(db.tenants.c.name).where(db.tenants.c.name == tenant)).first()
        if not exists:
            conn.execute(
                db.tenants.insert().values(name=tenant, max_concurrent_jobs=None, created_at=time.time())
            )
