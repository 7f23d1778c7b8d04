"""The bubblewrap command line of one sandboxed run, and the checks that bwrap can run here at all.

What the sandbox sees: read-only /usr (and the merged-/usr symlinks or dirs), the dynamic loader's
/etc files, the interpreter's prefix when it lives outside /usr, a private /proc and minimal /dev,
and a fresh size-capped tmpfs at /tmp: the only writable place. New user, pid, net, ipc, uts and
cgroup namespaces; no capabilities; no nested user namespaces; a clean environment; uid/gid 65534;
a seccomp filter that denies the kernel keyring (every run shares one host uid, and the keyring is
per uid, so keys one run adds would be visible to another through /proc/keys).
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from tgc_rl.sandbox.limits import SandboxLimits

SANDBOX_UID = 65534  # "nobody" inside the sandbox's own user namespace
WORKDIR = "/tmp"
# Environment of the sandboxed program: nothing of the host's.
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORKDIR,
    "TMPDIR": WORKDIR,
    "LANG": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
}
_MERGED_USR = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives")
_PYTHON_CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3")

INSTALL_HINT = (
    "Install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`), "
    "or, for trusted code only, use sandbox mode 'unsafe_local'."
)
USERNS_HINT = (
    "bubblewrap needs user namespaces. Enable them: `sysctl -w kernel.unprivileged_userns_clone=1` "
    "(Debian), `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (Ubuntu 23.10+), "
    "`sysctl -w user.max_user_namespaces=15000`; inside a container allow the clone/unshare/mount "
    "syscalls (e.g. docker run --security-opt seccomp=unconfined --security-opt apparmor=unconfined). "
    "For trusted code only, sandbox mode 'unsafe_local' runs without isolation."
)


class SandboxUnavailable(RuntimeError):
    """bwrap cannot run here; the message says how to make it run."""


DENIED_SYSCALLS = ("add_key", "request_key", "keyctl")  # the kernel keyring: shared per host uid


@functools.cache
def seccomp_program() -> bytes:
    """The compiled BPF filter bwrap installs (`--seccomp FD`): DENIED_SYSCALLS fail with EPERM, the rest
    run; a syscall of another architecture (e.g. int 0x80 from a 64-bit process) kills the program."""
    try:
        import pyseccomp
    except (ImportError, OSError) as e:  # the module, or libseccomp.so.2 it loads
        raise SandboxUnavailable(
            f"the sandbox's seccomp filter needs libseccomp (`apt-get install "
            f"libseccomp2`) and the pyseccomp package: {e}"
        ) from None
    f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        f.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def find_bwrap() -> str:
    path = os.environ.get("TGC_BWRAP") or shutil.which("bwrap")
    if not path:
        raise SandboxUnavailable(
            f"the code sandbox needs bubblewrap (`bwrap`), which is not on PATH. {INSTALL_HINT}"
        )
    return path


def host_uid() -> int | None:
    """The unprivileged host uid bwrap runs as when we are root, else None (run as ourselves).

    As root, a user namespace maps the sandbox onto uid 0, which the kernel exempts from RLIMIT_NPROC;
    running bwrap as an unprivileged uid keeps the process limit real, and an escape lands unprivileged.
    """
    if os.geteuid() != 0:
        return None
    value = os.environ.get("TGC_SANDBOX_HOST_UID", str(SANDBOX_UID))
    try:
        uid = int(value)
    except ValueError:
        raise SandboxUnavailable(
            f"TGC_SANDBOX_HOST_UID={value!r}: must be an integer uid, e.g. 65534"
        ) from None
    if not 0 < uid < 2**31:
        raise SandboxUnavailable(f"TGC_SANDBOX_HOST_UID={uid}: must be an unprivileged uid in 1..2**31-1")
    return uid


def drop_privileges(uid: int) -> list[str] | None:
    """A `setpriv` prefix that runs bwrap as `uid`, or None where setpriv is missing.

    An exec'd setpriv lets subprocess keep its fast vfork path; `Popen(user=...)` instead forces a
    full fork, whose page-table copy costs tens of ms per run in a large reward worker.
    """
    path = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if path is None:
        return None
    return [path, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]


def find_python(explicit: str | None = None, unprivileged: bool = False) -> str:
    """The interpreter that runs sandboxed programs: a system Python by default (stdlib only, run with -S).

    With `unprivileged` (we are root and bwrap runs as an unprivileged uid), only interpreters that uid
    can reach count, e.g. not one under /root.
    """
    explicit = explicit or os.environ.get("TGC_SANDBOX_PYTHON")
    if explicit and not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
        raise SandboxUnavailable(
            f"sandbox interpreter {explicit!r} (python= or TGC_SANDBOX_PYTHON) is not "
            "an executable file; point it at a python3, e.g. /usr/bin/python3"
        )
    fallback = str(Path(sys.base_prefix) / "bin" / "python3")
    candidates = [explicit] if explicit else [*_PYTHON_CANDIDATES, fallback]
    tried = []
    for c in candidates:
        if not (c and os.path.isfile(c) and os.access(c, os.X_OK)):
            continue
        tried.append(c)
        if explicit or not unprivileged or _reachable_by_others(c):
            return c
    raise SandboxUnavailable(
        f"no Python interpreter for the sandbox (found {tried or 'none'}"
        f"{', none reachable by the unprivileged sandbox user' if tried else ''}); install python3 "
        "(`apt-get install python3-minimal`) or set TGC_SANDBOX_PYTHON to an interpreter path"
    )


def _reachable_by_others(python: str) -> bool:
    prefix = python_prefix_bind(python)
    try:
        check_world_accessible(os.path.realpath(python), "interpreter")
        if prefix:
            check_world_accessible(prefix, "prefix")
    except SandboxUnavailable:
        return False
    return True


def python_prefix_bind(python: str) -> str | None:
    """The interpreter's install prefix when it is not under /usr (which is bound anyway)."""
    real = Path(os.path.realpath(python))
    if real.is_relative_to("/usr"):
        return None
    return str(real.parent.parent)


def check_world_accessible(path: str, what: str) -> None:
    """As root we run bwrap as an unprivileged uid, which must be able to reach `path`."""
    p = Path(path)
    for part in [*reversed(p.parents), p]:
        mode = part.stat().st_mode
        need = stat.S_IXOTH if part != p or stat.S_ISDIR(mode) else stat.S_IROTH
        if not mode & need:
            raise SandboxUnavailable(
                f"{what} {path} is not reachable by the unprivileged sandbox user ({part} has mode "
                f"{stat.filemode(mode)}); use a system interpreter (TGC_SANDBOX_PYTHON=/usr/bin/python3, "
                "`apt-get install python3-minimal`) or make the path world-readable"
            )


def system_binds(python: str) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _MERGED_USR:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{name}"]
    for name in _ETC:
        if (Path("/etc") / name).exists():
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    prefix = python_prefix_bind(python)
    if prefix is not None:
        args += ["--ro-bind", prefix, prefix]
    return args


def bwrap_argv(
    bwrap: str,
    python: str,
    limits: SandboxLimits,
    files: list[tuple[int, str]],
    status_fd: int,
    seccomp_fd: int,
) -> list[str]:
    """The bwrap command up to (not including) the command it runs; `files` are (fd, path in sandbox),
    `seccomp_fd` holds seccomp_program()."""
    args = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--seccomp",
        str(seccomp_fd),
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--hostname",
        "sandbox",
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        *system_binds(python),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(limits.tmpfs_mb << 20),
        "--tmpfs",
        WORKDIR,
    ]
    made: set[str] = {WORKDIR}
    for fd, dest in files:
        for parent in reversed(Path(dest).parents):
            if str(parent).startswith(WORKDIR + "/") and str(parent) not in made:
                args += ["--dir", str(parent)]
                made.add(str(parent))
        args += ["--file", str(fd), dest]
    # Everything but the tmpfs read-only once set up: the root tmpfs and /dev would otherwise be writable.
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--json-status-fd", str(status_fd), "--clearenv"]
    for key, value in SANDBOX_ENV.items():
        args += ["--setenv", key, value]
    args += ["--chdir", WORKDIR, "--"]
    return args
