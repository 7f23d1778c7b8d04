"""Resource limits of one sandboxed run: what the program may use before it is stopped."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. rlimits apply to every process of the run; the wall clock to the whole run.

    Defaults suit a verification of a short model-written program: ten seconds, 512 MiB of address
    space per process, a few dozen processes, 16 MiB files in a 64 MiB work dir, 1 MiB of output.
    """

    wall_s: float = 10.0  # wall-clock deadline: the whole process tree is killed when it passes
    cpu_s: int = 10  # RLIMIT_CPU per process (SIGXCPU, then SIGKILL one second later)
    memory_mb: int = 512  # RLIMIT_AS per process
    processes: int = 32  # RLIMIT_NPROC: processes and threads of the sandbox user, counted per run
    file_size_mb: int = 16  # RLIMIT_FSIZE: largest file the program may write
    open_files: int = 64  # RLIMIT_NOFILE
    tmpfs_mb: int = 64  # size of the fresh tmpfs work dir, the only writable place
    max_output_bytes: int = 1 << 20  # per stream (stdout, stderr); more kills the run

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"sandbox limit {f.name}={value!r}: must be a positive number")
        if self.cpu_s != int(self.cpu_s):
            raise ValueError(f"sandbox limit cpu_s={self.cpu_s!r}: must be a whole number of seconds")

    def replace(self, **changes: Any) -> SandboxLimits:
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            known = [f.name for f in fields(self)]
            raise ValueError(f"unknown sandbox limit(s) {sorted(unknown)}; known: {known}")
        return replace(self, **changes)

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """(soft, hard) per resource name of the `resource` module, as the in-sandbox launcher sets them."""
        mib = 1 << 20
        cpu = int(self.cpu_s)
        return {
            "RLIMIT_CPU": (cpu, cpu + 1),
            "RLIMIT_AS": (self.memory_mb * mib, self.memory_mb * mib),
            "RLIMIT_NPROC": (self.processes, self.processes),
            "RLIMIT_FSIZE": (self.file_size_mb * mib, self.file_size_mb * mib),
            "RLIMIT_NOFILE": (self.open_files, self.open_files),
            "RLIMIT_CORE": (0, 0),
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
