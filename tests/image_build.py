"""The test image, built once a session and in the background: the build is mostly downloads and unpacking
(~10 min on a new machine), so it starts when collection ends, beside the other tests, and the image tests
run once it had time (tests/scheduling.py) and wait for it.

The build runs detached (its own session, parented by init), so no test sees its processes as its own
stray children; the session's end stops it if it is still running.

Under pytest-xdist the controller starts the build (it sees every worker's collection) into a folder named in
the environment before the workers start, and the worker that runs the image tests waits on that folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE = (
    os.environ.get("TGC_IMAGE_ENGINE")
    or shutil.which("podman")
    and "podman"
    or shutil.which("docker")
    and "docker"
)
TAG = "localhost/tgc-rl:test"
IMAGE_TESTS = "tests/deploy/test_image.py"
BUILD = ["bash", "scripts/build-image.sh", "--debian-base", "--tag", TAG]


@dataclass(frozen=True)
class BuildResult:
    returncode: int
    stdout: str
    stderr: str


class BackgroundBuild:
    """scripts/build-image.sh running detached, its output and exit status in files of a temporary folder."""

    def __init__(self, folder: Path) -> None:
        self.dir = folder

    def start(self) -> None:
        # setsid forks (its caller already leads a session), so the build's parent is init, not this process
        launcher = subprocess.Popen(
            [
                "setsid",
                "bash",
                "-c",
                'echo $$ >"$0/pid"; "${@}" >"$0/out" 2>"$0/err"; echo $? >"$0/rc"',
                str(self.dir),
                *BUILD,
            ],
            cwd=ROOT,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        launcher.wait()

    def started(self) -> bool:
        return (self.dir / "pid").exists()

    def _pid(self) -> int | None:
        try:
            return int((self.dir / "pid").read_text())
        except (OSError, ValueError):
            return None

    def wait(self, timeout: float) -> BuildResult:
        start = time.monotonic()
        deadline = start + timeout
        rc = self.dir / "rc"
        while not rc.exists():
            if not self.started() and time.monotonic() > start + 120:
                return BuildResult(125, "", f"no build was started in {self.dir}")
            if time.monotonic() > deadline:
                self.stop()
                return BuildResult(
                    124, self._read("out"), self._read("err") + f"\nbuild not done in {timeout} s"
                )
            time.sleep(1)
        while not rc.read_text().strip():  # written, not yet flushed
            time.sleep(0.1)
        return BuildResult(int(rc.read_text()), self._read("out"), self._read("err"))

    def _read(self, name: str) -> str:
        path = self.dir / name
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Stops a build still running (its whole process group) and removes the output folder."""
        pid = self._pid()
        if pid is not None and not (self.dir / "rc").exists():
            try:
                os.killpg(pid, signal.SIGTERM)
                time.sleep(2)
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


# Set by the session's first process, inherited by xdist workers.
FOLDER_VAR = "TGC_TEST_IMAGE_BUILD_DIR"
_build: BackgroundBuild | None = None  # in the process that started it
_named_here = False  # this process named the folder (it removes it at the end)


def prepare() -> None:
    """In the session's first process (before xdist starts its workers): names the build's folder."""
    global _named_here
    if FOLDER_VAR not in os.environ:
        os.environ[FOLDER_VAR] = tempfile.mkdtemp(prefix="tgc-image-build-")
        _named_here = True


def start_if_selected(nodeids: list[str]) -> None:
    """Starts the build when an image test is selected and can run (a container engine is installed)."""
    global _build
    if (
        _build is None
        and ENGINE
        and FOLDER_VAR in os.environ
        and any(n.startswith(IMAGE_TESTS) for n in nodeids)
    ):
        _build = BackgroundBuild(Path(os.environ[FOLDER_VAR]))
        _build.start()


def build_image(timeout: float) -> BuildResult:
    """The session's build result: the background build's, or a build run now when none was started."""
    if _build is not None:
        return _build.wait(timeout)
    if FOLDER_VAR in os.environ:  # an xdist worker: the controller started it
        return BackgroundBuild(Path(os.environ[FOLDER_VAR])).wait(timeout)
    done = subprocess.run(BUILD, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return BuildResult(done.returncode, done.stdout, done.stderr)


def stop() -> None:
    """At the end of the session: stops a build this process started and still running; the process that
    named the folder removes it."""
    global _build, _named_here
    if _build is not None:
        _build.stop()
        _build = None
    if _named_here:
        shutil.rmtree(os.environ.pop(FOLDER_VAR), ignore_errors=True)
        _named_here = False
