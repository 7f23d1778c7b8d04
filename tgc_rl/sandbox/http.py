"""A SandboxFusion-compatible HTTP endpoint (`POST /run_code`) served by the same `Sandbox`.

Request and response follow SandboxFusion's `/run_code` shapes, so datasets and tools written for it
(verl's sandbox_fusion reward, SkyRL's code envs) can point at this server. Languages: python, bash.
Run it: `python -m tgc_rl.sandbox.http --host 127.0.0.1 --port 8080`.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import os
import threading
from typing import Annotated, Literal

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import make_asgi_app
from pydantic import BaseModel, ConfigDict, Field

from tgc_rl.sandbox.executor import LANGUAGES, RunResult, Sandbox, SandboxError
from tgc_rl.sandbox.limits import SandboxLimits
from tgc_rl.startup import usable_cpus

MAX_RUN_TIMEOUT_S = 300.0
MAX_MEMORY_MB = 16_384
MAX_FILES = 256  # each file is an open descriptor while the work dir is written
MAX_PATH_CHARS = 1024


class RunCodeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    code: str = Field(..., max_length=4 * 2**20, description="The program text.")
    language: str = Field("python", max_length=32, description=f"One of: {', '.join(LANGUAGES)}.")
    compile_timeout: float = Field(
        10, gt=0, le=MAX_RUN_TIMEOUT_S, description="Accepted for compatibility; nothing here compiles."
    )
    run_timeout: float = Field(10, gt=0, le=MAX_RUN_TIMEOUT_S, description="Wall-clock deadline (s).")
    memory_limit_MB: int = Field(-1, ge=-1, le=MAX_MEMORY_MB, description="Address-space limit; -1: default.")
    stdin: str | None = Field(None, max_length=16 * 2**20, description="Text fed to the program's stdin.")
    files: dict[Annotated[str, Field(max_length=MAX_PATH_CHARS)], str | None] = Field(
        default_factory=dict,
        max_length=MAX_FILES,
        description=f"Relative path in the work dir -> base64 content, written first (at most {MAX_FILES}).",
    )
    fetch_files: list[Annotated[str, Field(max_length=MAX_PATH_CHARS)]] = Field(
        default_factory=list, max_length=MAX_FILES, description="Relative paths sent back (base64)."
    )
    args: list[str] = Field(
        default_factory=list, max_length=64, description="SandboxFusion's pytest arguments; keep empty."
    )


class CommandRunResult(BaseModel):
    status: Literal["Finished", "Error", "TimeLimitExceeded"]
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    status: Literal["Success", "Failed", "SandboxError"]
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


def create_app(sandbox: Sandbox | None = None, max_concurrency: int | None = None) -> FastAPI:
    """The app; `max_concurrency` sandboxes run at once (default: the CPUs this process may run on, its
    affinity mask, not the host's count), further requests wait."""
    box = sandbox or Sandbox()
    concurrency = max_concurrency or usable_cpus()
    slots = threading.BoundedSemaphore(concurrency)
    app = FastAPI(
        title="tgc-rl code sandbox", description="SandboxFusion-compatible /run_code over bubblewrap."
    )
    app.state.max_concurrency = concurrency
    app.mount("/metrics", make_asgi_app())

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        # FastAPI's default echoes each bad input back, and a NaN or Infinity there is not JSON: a 500
        detail = [
            {"loc": list(err.get("loc", ())), "msg": str(err.get("msg")), "type": str(err.get("type"))}
            for err in e.errors()
        ]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.get("/v1/ping")
    def ping() -> str:
        return "pong"

    @app.post("/run_code", response_model=RunCodeResponse)
    def run_code(req: RunCodeRequest) -> RunCodeResponse:
        if req.language not in LANGUAGES:
            raise HTTPException(
                422, f"language: {req.language!r} is not supported here; use one of {list(LANGUAGES)}"
            )
        if req.args:
            raise HTTPException(422, "args: pytest arguments are not supported; send an empty list")
        files = {name: _b64decode(name, data) for name, data in req.files.items() if data is not None}
        limits = box.limits.replace(wall_s=req.run_timeout, cpu_s=max(1, int(req.run_timeout + 0.999)))
        if req.memory_limit_MB > 0:
            limits = limits.replace(memory_mb=req.memory_limit_MB)
        pod = os.environ.get("MY_POD_NAME") or os.environ.get("HOSTNAME")
        with slots:
            try:
                result = box.run(
                    req.code,
                    language=req.language,
                    stdin=req.stdin,
                    files=files,
                    fetch=req.fetch_files,
                    limits=limits,
                )
            except ValueError as e:  # a bad path in files / fetch_files
                raise HTTPException(422, str(e)) from None
            except SandboxError as e:
                return RunCodeResponse(status="SandboxError", message=str(e), executor_pod_name=pod)
        return _response(result, limits, pod)

    return app


def _response(result: RunResult, limits: SandboxLimits, pod: str | None) -> RunCodeResponse:
    message = ""
    if result.status == "timeout":
        status = "TimeLimitExceeded"
    else:
        status = "Finished"
        if result.status == "output_limit":
            message = f"output exceeded {limits.max_output_bytes} bytes per stream; the run was killed"
    run = CommandRunResult(
        status=status,
        execution_time=round(result.wall_s, 6),
        return_code=result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
    )
    return RunCodeResponse(
        status="Success" if result.ok else "Failed",
        message=message,
        run_result=run,
        executor_pod_name=pod,
        files=result.files,
    )


def _b64decode(name: str, data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise HTTPException(422, f"files[{name!r}]: content must be base64-encoded") from None


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(
        description="Serve the code sandbox (SandboxFusion-compatible /run_code)."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument(
        "--unsafe-local", action="store_true", help="run WITHOUT isolation (no bwrap); for trusted code only"
    )
    args = parser.parse_args(argv)
    box = Sandbox(mode="unsafe_local" if args.unsafe_local else "bwrap")
    uvicorn.run(create_app(box, args.max_concurrency), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
