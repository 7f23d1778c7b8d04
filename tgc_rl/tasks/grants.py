"""Privileges: what a job spec may need that only the operator grants, which grants a job has, and the one
error for a privilege a job lacks.

The control plane decides a job's grants at submission (tgc_rl.control.policy) and hands them to the job
in `TGC_GRANTS`; every place the job would use a privilege (the trainer's entry, load_task, the reward
workers' sandbox) checks them here again, since the spec alone never grants anything.
This module imports pydantic only, so the control plane and the SDK can use it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel

CUSTOM_CODE = "custom_code"  # import and run code named by the spec (`module:function`)
HOST_PATHS = "host_paths"  # read files or directories of the worker host named by the spec
UNSAFE_SANDBOX = "unsafe_sandbox"  # run model-written code without the bubblewrap sandbox
PRIVILEGES = (CUSTOM_CODE, HOST_PATHS, UNSAFE_SANDBOX)
# What a process started by its own operator may do unasked: run the operator's code, read the operator's
# files. An unconfined sandbox is never implied; the control plane's jobs carry exactly their grants.
LOCAL_GRANTS = frozenset({CUSTOM_CODE, HOST_PATHS})
GRANTS_ENV = "TGC_GRANTS"  # set by the control plane for each job it runs (comma-separated; may be empty)


class GrantError(PermissionError):
    """The spec needs a privilege that the operator did not grant to this job."""


def job_grants() -> frozenset[str]:
    """This job's grants: `TGC_GRANTS` where the control plane (or `tgc train --allow-unsafe-sandbox`) set it,
    else LOCAL_GRANTS."""
    raw = os.environ.get(GRANTS_ENV)
    if raw is None:
        return LOCAL_GRANTS
    return frozenset(g for g in raw.split(",") if g in PRIVILEGES)


def encode_grants(grants: frozenset[str] | set[str]) -> str:
    return ",".join(sorted(g for g in grants if g in PRIVILEGES))


def missing_grants(needed: Mapping[str, str], grants: frozenset[str]) -> dict[str, str]:
    """{field path: privilege} of `needed` that `grants` lacks."""
    return {f: p for f, p in needed.items() if p not in grants}


def require_grants(needed: Mapping[str, str], grants: frozenset[str]) -> None:
    """Raise GrantError naming every field of `needed` ({field path: privilege}) whose privilege is missing."""
    missing = missing_grants(needed, grants)
    if missing:
        raise GrantError(
            "not allowed for this job: "
            + "; ".join(f"{f} needs the grant '{p}'" for f, p in missing.items())
            + " (the operator decides; see docs/security.md)"
        )


def privileged_fields(parsed: BaseModel | None) -> dict[str, str]:
    """{`task.params.<field>`: privilege} for each field of a params model marked `privilege` in its schema
    and set away from its (safe) default."""
    if parsed is None:
        return {}
    out = {}
    for name, info in type(parsed).model_fields.items():
        extra = info.json_schema_extra
        if isinstance(extra, dict) and "privilege" in extra and getattr(parsed, name) != info.default:
            out[f"task.params.{name}"] = str(extra["privilege"])
    return out
