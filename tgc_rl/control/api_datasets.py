"""`/v1/datasets`: a tenant's own data files for the `dataset` task (upload, list, read, delete).

`POST /v1/datasets?name=train.jsonl` with the file as the raw body (size-limited by the server setting
max_dataset_bytes); a job then names it as `task.params.dataset_id` (or `eval.dataset.dataset_id`). A tenant
sees only its own datasets (another's is a 404); an admin token sees all. What an upload may cost the server
is bounded by the dataset_* settings (docs/security.md#dataset-uploads).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from tgc_rl.control.auth import current_principal
from tgc_rl.control.datasets import (
    DatasetRefused,
    DatasetRow,
    DatasetStore,
    DatasetTooLarge,
    QuotaExceeded,
    TooManyUploads,
)
from tgc_rl.control.errors import ApiError
from tgc_rl.control.inspection import InspectorBusy
from tgc_rl.control.tokens import Principal
from tgc_rl.wire import DatasetList, DatasetRecord, ErrorBody, ErrorDetail

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])
Caller = Annotated[Principal, Depends(current_principal)]

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing, invalid or revoked token."},
    404: {"model": ErrorBody, "description": "No such dataset (or another tenant's)."},
    422: {"model": ErrorBody, "description": "Invalid input; `detail` names what to change."},
}


def _record(row: DatasetRow) -> DatasetRecord:
    return DatasetRecord(
        id=row.id,
        name=row.name,
        tenant=row.tenant,
        format=row.format,
        size_bytes=row.size_bytes,
        sha256=row.sha256,
        rows=row.rows,
        columns=row.columns,
        created_at=datetime.fromtimestamp(row.created_at, UTC),
    )


def _store(request: Request) -> DatasetStore:
    return request.app.state.cp.datasets


@router.post(
    "",
    status_code=201,
    response_model=DatasetRecord,
    responses={
        **_ERRORS,
        200: {
            "model": DatasetRecord,
            "description": "The same content was uploaded before (also when "
            "identical uploads race): the existing dataset.",
        },
        409: {
            "model": ErrorBody,
            "description": "The tenant's dataset quota (dataset_quota_count or "
            "dataset_quota_bytes) would be passed; `message` names it. Delete datasets to make room.",
        },
        413: {"model": ErrorBody, "description": "Larger than the server's max_dataset_bytes."},
        422: {
            "model": ErrorBody,
            "description": "A name or file no job can use: `message` names the row and "
            "column, or the cap the file passes (rows, columns, decoded bytes, nesting, the inspection's "
            "CPU or memory).",
        },
        429: {
            "model": ErrorBody,
            "description": "The tenant already has dataset_uploads_per_tenant uploads in progress.",
            "headers": {"Retry-After": {"schema": {"type": "integer"}}},
        },
        503: {
            "model": ErrorBody,
            "description": "Every inspection slot is busy (dataset_inspect_concurrency); "
            "retry after `Retry-After` seconds.",
            "headers": {"Retry-After": {"schema": {"type": "integer"}}},
        },
    },
    summary="Upload a dataset file (the raw body: JSONL, Parquet or CSV)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def upload_dataset(
    request: Request,
    response: Response,
    caller: Caller,
    name: Annotated[
        str,
        Query(
            min_length=1,
            max_length=128,
            description="File name; .jsonl, .json, .parquet or .csv decides the format.",
        ),
    ],
) -> DatasetRecord:
    store = _store(request)
    try:
        with store.uploading(caller.tenant):
            try:
                upload = await run_in_threadpool(store.begin, name)
            except DatasetRefused as e:
                raise ApiError(422, str(e), [ErrorDetail(field="name", msg=str(e))]) from None
            try:
                async for chunk in request.stream():
                    upload.write(chunk)
            except BaseException:
                upload.discard()
                raise
            row, created = await run_in_threadpool(store.commit, caller.tenant, upload)
    except TooManyUploads as e:
        raise ApiError(429, str(e), headers={"Retry-After": "5"}) from None
    except InspectorBusy as e:
        raise ApiError(503, str(e), headers={"Retry-After": str(e.retry_after_s)}) from None
    except DatasetTooLarge as e:
        raise ApiError(413, str(e)) from None
    except QuotaExceeded as e:
        raise ApiError(409, str(e), code="quota_exceeded") from None
    except DatasetRefused as e:
        raise ApiError(422, f"dataset refused: {e}", [ErrorDetail(field="body", msg=str(e))]) from None
    if not created:
        response.status_code = 200
    response.headers["Location"] = f"/v1/datasets/{row.id}"
    return _record(row)


@router.get("", response_model=DatasetList, responses=_ERRORS, summary="List datasets, newest first")
def list_datasets(request: Request, caller: Caller) -> DatasetList:
    rows = _store(request).list(None if caller.is_admin else caller.tenant)
    return DatasetList(datasets=[_record(r) for r in rows])


@router.get(
    "/{dataset_id}", response_model=DatasetRecord, responses=_ERRORS, summary="Get a dataset's record"
)
def get_dataset(request: Request, caller: Caller, dataset_id: str) -> DatasetRecord:
    row = _store(request).get(dataset_id, None if caller.is_admin else caller.tenant)
    if row is None:
        raise ApiError(404, f"no dataset {dataset_id!r}")
    return _record(row)


@router.delete("/{dataset_id}", status_code=204, responses=_ERRORS, summary="Delete a dataset and its file")
def delete_dataset(request: Request, caller: Caller, dataset_id: str) -> Response:
    if not _store(request).delete(dataset_id, None if caller.is_admin else caller.tenant):
        raise ApiError(404, f"no dataset {dataset_id!r}")
    return Response(status_code=204)
