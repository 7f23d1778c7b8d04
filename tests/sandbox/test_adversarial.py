"""Hostile programs against the real bwrap sandbox: each must be contained and leave the host unchanged.

Every program reports its attempts as `BLOCKED <name>` or `ESCAPED <name>`; a test passes only when
each named attempt ran and was blocked (so a program that never got that far cannot pass), and the
`host` checks after each test find the canary files, the project, the host's processes and its
temp dirs as they were. The last tests run hostile responses through a RewardPool and check that it
still serves, with no stray process or file left behind.
"""

import hashlib
import os
import signal
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

import tgc_rl
from tests.proc_helpers import alive, descendants, wait_until
from tgc_rl.config import TaskSpec
from tgc_rl.reward import RewardPool
from tgc_rl.sandbox import Sandbox, SandboxLimits
from tgc_rl.tasks import load_task

PROJECT = Path(tgc_rl.__file__).resolve().parents[1]
MARK = f"tgcmark{uuid.uuid4().hex[:12]}"  # in every name a hostile program creates, so leftovers are findable
LIMITS = SandboxLimits(
    wall_s=8.0,
    cpu_s=8,
    memory_mb=256,
    processes=24,
    file_size_mb=4,
    open_files=48,
    tmpfs_mb=16,
    max_output_bytes=64 << 10,
)
PRELUDE = '''
import ctypes, json, os, socket, sys, time
libc = ctypes.CDLL(None, use_errno=True)

def attempt(name, fn):
    try:
        result = fn()
    except BaseException as e:
        print(f"BLOCKED {name}: {type(e).__name__}: {e}"[:300], flush=True)
    else:
        print(f"ESCAPED {name}: {result!r}"[:300], flush=True)

def c_call(ret):
    """A libc call that returned -1 failed: raise like Python would."""
    if ret == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return ret
'''
PROJECT_FILES = ["pyproject.toml", "tgc_rl/config/job.py", "tgc_rl/reward/pool.py"]
SCAN_DIRS = ["/tmp", "/var/tmp", "/dev/shm", str(PROJECT), str(PROJECT / "tgc_rl")]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def marked_processes() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if MARK.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return [p for p in found if p != os.getpid() and alive(p)]


def marked_files() -> list[str]:
    out = []
    for d in SCAN_DIRS:
        try:
            out += [f"{d}/{n}" for n in os.listdir(d) if MARK in n]
        except OSError:
            pass
    return out


def sandbox_user_processes() -> set[int]:
    uid = 65534 if os.geteuid() == 0 else os.geteuid()
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid and alive(int(entry)):
                    pids.add(int(entry))
            except OSError:
                pass
    return pids


@pytest.fixture(scope="module")
def box():
    return Sandbox(LIMITS)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """Things on the host a hostile program would like to touch."""
    d = tmp_path_factory.mktemp("host")
    canary = d / "canary.txt"
    canary.write_text("untouched\n")
    os.chmod(d, 0o777)  # even a world-writable host dir must stay out of reach
    os.chmod(canary, 0o666)
    sleeper = subprocess.Popen(["sleep", "3600"])
    yield {"dir": d, "canary": canary, "sleeper": sleeper}
    sleeper.kill()
    sleeper.wait()


@pytest.fixture(autouse=True)
def host_unchanged(host):
    project = {f: sha(PROJECT / f) for f in PROJECT_FILES}
    canary = (sha(host["canary"]), host["canary"].stat().st_mtime_ns)
    host_dir = sorted(os.listdir(host["dir"]))
    sandbox_pids = sandbox_user_processes()
    children = descendants(os.getpid())
    yield
    assert {f: sha(PROJECT / f) for f in PROJECT_FILES} == project
    assert (sha(host["canary"]), host["canary"].stat().st_mtime_ns) == canary
    assert sorted(os.listdir(host["dir"])) == host_dir
    assert alive(host["sleeper"].pid)
    assert wait_until(lambda: not marked_processes(), timeout=5), f"stray processes {marked_processes()}"
    assert not marked_files()
    assert wait_until(lambda: sandbox_user_processes() <= sandbox_pids, timeout=5)
    assert wait_until(lambda: descendants(os.getpid()) <= children, timeout=5)


def run(box, body: str, **limits) -> "object":
    return box.run(PRELUDE + body, limits=LIMITS.replace(**limits) if limits else None)


def assert_blocked(result, *names: str) -> None:
    out = result.stdout
    assert "ESCAPED" not in out, out
    for name in names:
        assert f"BLOCKED {name}:" in out, f"{name} was not attempted:\n{out}\n{result.stderr}"


# -- processes ---------------------------------------------------------------------------------------------
def test_fork_bomb_is_contained(box):
    r = run(
        box,
        "while True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n",
        wall_s=2.0,
    )
    assert r.status == "timeout"


def test_process_count_stops_at_the_limit(box):
    r = run(
        box,
        """
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as e:
    print("forked", n, e.errno)
""",
    )
    forked = int(r.stdout.split()[1])
    assert 0 < forked < LIMITS.processes


def test_thread_bomb_stops_at_the_limit(box):
    r = run(
        box,
        """
import threading
threads = []
try:
    while True:
        t = threading.Thread(target=time.sleep, args=(30,), daemon=True)
        t.start()
        threads.append(t)
except RuntimeError:
    print("threads", len(threads), flush=True)
    os._exit(0)
""",
    )
    assert 0 < int(r.stdout.split()[1]) < LIMITS.processes


def test_daemon_cannot_outlive_the_run(box):
    r = run(
        box,
        f"""
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/usr/bin/sleep", ["{MARK}-daemon", "300"])
    os._exit(0)
time.sleep(0.3)
print("parent exits")
""",
    )
    assert r.ok and "parent exits" in r.stdout  # the host_unchanged check finds no daemon afterwards


def test_killing_the_parent_and_init_does_not_reach_the_host(box, host):
    r = run(
        box,
        """
attempt("kill-parent", lambda: os.kill(os.getppid(), 9) or os.kill(os.getppid(), 0) or "parent survives")
attempt("kill-init", lambda: os.kill(1, 9) or "init survives")
time.sleep(0.2)
print("still here")
""",
    )
    assert r.status == "finished" and "still here" in r.stdout  # the sandbox's init shrugs off the signal
    assert alive(host["sleeper"].pid)
    assert box.run("print('next run')").stdout == "next run\n"


def test_signals_cannot_reach_host_processes(box, host):
    pid = host["sleeper"].pid
    r = run(
        box,
        f"""
attempt("kill-host-pid", lambda: os.kill({pid}, 9) or ("sent", open("/proc/{pid}/cmdline").read()))
attempt("kill-everything", lambda: os.kill(-1, 9))
""",
    )
    assert_blocked(r, "kill-host-pid")  # that pid does not exist in the sandbox's pid namespace
    assert alive(pid)


# -- memory, cpu, time, output ------------------------------------------------------------------------------
def test_memory_bomb_hits_the_address_space_limit(box):
    r = run(box, 'attempt("allocate-2GiB", lambda: len(bytearray(2 << 30)))\n')
    assert_blocked(r, "allocate-2GiB")
    assert "MemoryError" in r.stdout


def test_growing_memory_stops_below_the_limit(box):
    r = run(
        box,
        """
chunks = []
try:
    while True:
        chunks.append(bytearray(8 << 20))
except MemoryError:
    print("MiB", 8 * len(chunks))
""",
    )
    assert 0 < int(r.stdout.split()[1]) < LIMITS.memory_mb


def test_infinite_loop_is_killed_at_the_wall_deadline(box):
    r = run(box, "while True:\n    pass\n", wall_s=1.5)
    assert r.status == "timeout" and not r.ok


def test_cpu_time_limit_kills_a_busy_program(box):
    r = run(box, "while True:\n    pass\n", cpu_s=1, wall_s=20.0)
    assert r.status == "finished"
    assert r.signal in (signal.SIGXCPU, signal.SIGKILL)


def test_sleeping_past_the_deadline_is_killed(box):
    r = run(box, "time.sleep(120)\n", wall_s=1.0)
    assert r.status == "timeout"


def test_huge_stdout_is_capped_and_the_run_killed(box):
    r = run(box, "while True:\n    sys.stdout.write('x' * 65536)\n")
    assert r.status == "output_limit" and len(r.stdout) <= LIMITS.max_output_bytes


def test_huge_stderr_is_capped_and_the_run_killed(box):
    r = run(box, "while True:\n    sys.stderr.write('y' * 65536)\n")
    assert r.status == "output_limit" and len(r.stderr) <= LIMITS.max_output_bytes


# -- files ---------------------------------------------------------------------------------------------------
def test_writes_outside_the_work_dir_fail(box, host):
    targets = [
        "/usr",
        "/etc",
        "",
        "/proc",
        "/dev",
        "/dev/shm",
        "/var/tmp",
        "/root",
        "/home",
        str(PROJECT),
        str(host["dir"]),
    ]
    body = "".join(
        f'attempt("write {t or "/"}", lambda: open("{t}/{MARK}", "w").write("x"))\n' for t in targets
    )
    body += f'attempt("overwrite canary", lambda: open("{host["canary"]}", "w").write("pwned"))\n'
    r = run(box, body)
    assert_blocked(r, *[f"write {t or '/'}" for t in targets], "overwrite canary")


def test_project_files_are_invisible(box):
    r = run(
        box,
        f"""
attempt("read pyproject", lambda: open("{PROJECT}/pyproject.toml").read())
attempt("read config", lambda: open("{PROJECT}/tgc_rl/config/job.py").read())
attempt("list project", lambda: os.listdir("{PROJECT}"))
# the parent may exist inside the sandbox (a checkout under /tmp: that is the sandbox's own work dir), but
# the project must not be in it
def in_listing(parent, name):
    if name not in os.listdir(parent):
        raise FileNotFoundError(f"{{name}} is not in {{parent}}")
    return True
attempt("list parent", lambda: in_listing("{PROJECT.parent}", "{PROJECT.name}"))
""",
    )
    assert_blocked(r, "read pyproject", "read config", "list project", "list parent")


def test_host_secrets_are_unreadable(box):
    r = run(
        box,
        """
for path in ["/etc/shadow", "/etc/passwd", "/etc/hostname", "/root/.bashrc", "/root/.ssh/id_rsa",
             "/root/.gitconfig", "/proc/1/root/etc/shadow"]:
    attempt("read " + path, lambda path=path: open(path).read())
""",
    )
    assert_blocked(
        r,
        "read /etc/shadow",
        "read /etc/passwd",
        "read /etc/hostname",
        "read /root/.bashrc",
        "read /root/.gitconfig",
        "read /proc/1/root/etc/shadow",
    )


def test_environment_secrets_do_not_leak(box, monkeypatch):
    secret = f"{MARK}-secret-value"
    monkeypatch.setenv("TGC_FAKE_API_KEY", secret)
    r = run(
        box,
        """
print(dict(os.environ))
for pid in ("self", "1", "2"):
    try:
        print(open(f"/proc/{pid}/environ", "rb").read())
    except OSError as e:
        print(pid, e)
""",
    )
    assert "PATH" in r.stdout  # the dump ran
    assert secret not in r.stdout and "TGC_FAKE_API_KEY" not in r.stdout


def test_filling_the_work_dir_stops_at_its_size(box):
    r = run(
        box,
        f"""
i = 0
try:
    while True:
        with open(f"/tmp/{MARK}-{{i}}", "wb") as f:
            f.write(b"x" * (1 << 20))
        i += 1
except OSError as e:
    print("MiB", i, e.errno)
""",
    )
    mib, errno = map(int, r.stdout.split()[1:3])
    assert mib <= LIMITS.tmpfs_mb and errno == 28  # ENOSPC inside the sandbox's own tmpfs


def test_one_huge_file_stops_at_the_file_size_limit(box):
    r = run(
        box,
        """
written = 0
try:
    with open("/tmp/big", "wb") as f:
        while True:
            f.write(b"x" * (256 << 10))
            written += 256 << 10
except OSError as e:
    print("bytes", written, e.errno)
""",
    )
    written, errno = map(int, r.stdout.split()[1:3])
    assert written <= LIMITS.file_size_mb << 20 and errno == 27  # EFBIG


def test_symlinks_do_not_lead_outside(box):
    r = run(
        box,
        f"""
for i, target in enumerate(["/etc/shadow", "{PROJECT}/pyproject.toml", "/proc/1/root/etc/shadow",
                            "/proc/self/root/../../etc/shadow", "/proc/self/cwd/../../root/.bashrc"]):
    os.symlink(target, f"/tmp/link{{i}}")
    attempt(f"follow link{{i}}", lambda i=i: open(f"/tmp/link{{i}}").read())
""",
    )
    assert_blocked(r, *[f"follow link{i}" for i in range(5)])


def test_proc_shows_only_the_sandbox(box):
    r = run(
        box,
        """
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
attempt("write /proc/sys", lambda: open("/proc/sys/kernel/hostname", "w").write("owned"))
attempt("write sysrq", lambda: open("/proc/sysrq-trigger", "w").write("b"))
attempt("host mounts writable", lambda: open("/proc/self/mounts").read().count(" rw,") > 2 and 1 / 0)
""",
    )
    assert_blocked(r, "write /proc/sys", "write sysrq", "host mounts writable")
    pids = eval(r.stdout.split("pids ", 1)[1].split("\n", 1)[0])
    assert len(pids) <= 3 and os.getpid() not in pids[2:]


def test_file_descriptors_stop_at_the_limit(box):
    r = run(
        box,
        """
fds = []
try:
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    print("fds", len(fds), e.errno)
""",
    )
    n, errno = map(int, r.stdout.split()[1:3])
    assert n < LIMITS.open_files and errno == 24  # EMFILE


def test_sys_and_dev_shm_are_out_of_reach(box):
    r = run(
        box,
        """
attempt("list /sys", lambda: os.listdir("/sys"))
attempt("write /dev/shm", lambda: open("/dev/shm/x", "w").write("x"))
attempt("read disk", lambda: open("/dev/vda", "rb").read(16))
""",
    )
    assert_blocked(r, "list /sys", "write /dev/shm", "read disk")


# -- network -------------------------------------------------------------------------------------------------
def _host_ip() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # routing only; no packet is sent
            return s.getsockname()[0]
        except OSError:
            return None


def test_tcp_to_a_host_server_is_impossible(box):
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    addresses = ["127.0.0.1"] + ([_host_ip()] if _host_ip() else [])
    body = "".join(
        f'attempt("tcp {a}", lambda: socket.create_connection(("{a}", {port}), timeout=2))\n'
        for a in addresses
    )
    r = run(box, body)
    assert_blocked(r, *[f"tcp {a}" for a in addresses])
    with pytest.raises(TimeoutError):
        server.accept()
    server.close()


def test_udp_to_a_host_socket_never_arrives(box):
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("0.0.0.0", 0))
    receiver.settimeout(0.5)
    port = receiver.getsockname()[1]
    addresses = ["127.0.0.1"] + ([_host_ip()] if _host_ip() else [])
    body = "".join(
        f'attempt("udp {a}", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)'
        f'.sendto(b"{MARK}", ("{a}", {port})) and 1 / 0)\n'
        for a in addresses
    )
    r = run(box, body)  # a send may "succeed" into the sandbox's own loopback; nothing may reach the host
    assert "ESCAPED" not in r.stdout
    with pytest.raises(TimeoutError):
        receiver.recvfrom(100)
    receiver.close()


def test_external_network_is_unreachable(box):
    r = run(
        box,
        """
attempt("tcp out", lambda: socket.create_connection(("1.1.1.1", 53), timeout=2))
attempt("udp out", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53)))
attempt("ipv6 out", lambda: socket.create_connection(("2606:4700:4700::1111", 53), timeout=2))
""",
    )
    assert_blocked(r, "tcp out", "udp out", "ipv6 out")


def test_dns_resolution_fails(box):
    r = run(box, 'attempt("dns", lambda: socket.getaddrinfo("example.com", 80))\n')
    assert_blocked(r, "dns")


def test_host_abstract_unix_socket_is_unreachable(box):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(f"\0{MARK}")
    server.listen()
    server.settimeout(0.5)
    r = run(
        box,
        f"""
def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\\0{MARK}")
attempt("abstract unix", connect)
""",
    )
    assert_blocked(r, "abstract unix")
    with pytest.raises(TimeoutError):
        server.accept()
    server.close()


# -- privilege and escapes ------------------------------------------------------------------------------
def test_ctypes_cannot_regain_privileges(box, host):
    r = run(
        box,
        f"""
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
attempt("setuid 0", lambda: c_call(libc.setuid(0)))
attempt("unshare user", lambda: c_call(libc.unshare(CLONE_NEWUSER)))
attempt("unshare mount", lambda: c_call(libc.unshare(CLONE_NEWNS)))
attempt("mount", lambda: c_call(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
attempt("chroot", lambda: c_call(libc.chroot(b"/tmp")))
attempt("ptrace host pid", lambda: c_call(libc.ptrace(16, {host["sleeper"].pid}, 0, 0)))
attempt("os.setuid", lambda: os.setuid(0))
""",
    )
    assert_blocked(
        r, "setuid 0", "unshare user", "unshare mount", "mount", "chroot", "ptrace host pid", "os.setuid"
    )


def test_the_kernel_keyring_is_closed_to_runs(box):
    # Every run has the same host uid and the keyring is per uid: a key one run added would be listed in
    # another run's /proc/keys. The seccomp filter refuses the keyring syscalls outright.
    r = run(
        box,
        f"""
SYS_add_key, SYS_request_key, SYS_keyctl = 248, 249, 250
KEY_SPEC_USER_KEYRING = -4
attempt("add_key", lambda: c_call(libc.syscall(SYS_add_key, b"user", b"{MARK}", b"secret", 6, KEY_SPEC_USER_KEYRING)))
attempt("request_key", lambda: c_call(libc.syscall(SYS_request_key, b"user", b"{MARK}", None, 0)))
attempt("keyctl", lambda: c_call(libc.syscall(SYS_keyctl, 0, KEY_SPEC_USER_KEYRING, 0)))
print("KEYS", open("/proc/keys").read().count("{MARK}"))
""",
    )
    assert_blocked(r, "add_key", "request_key", "keyctl")
    assert "Operation not permitted" in r.stdout and "KEYS 0" in r.stdout


def test_shell_escapes_run_unprivileged_and_confined(box):
    r = run(
        box,
        f"""
os.system("id -u; cat /etc/shadow; ls {PROJECT}; cat /root/.bashrc; echo done")
print(os.popen("id -u").read().strip() == "65534" and "unprivileged")
""",
    )
    assert "\ndone\n" in r.stdout and "unprivileged" in r.stdout
    assert "tgc-rl" not in r.stdout and "root:" not in r.stdout


def test_nested_sandbox_cannot_be_created(box):
    r = run(
        box,
        """
import subprocess
attempt("nested bwrap", lambda: subprocess.run(["bwrap", "--ro-bind", "/", "/", "true"], check=True,
                                               capture_output=True))
""",
    )
    assert_blocked(r, "nested bwrap")


def test_raising_rlimits_is_refused(box):
    r = run(
        box,
        """
import resource
attempt("raise nproc", lambda: resource.setrlimit(resource.RLIMIT_NPROC, (10**6, 10**6)))
attempt("raise as", lambda: resource.setrlimit(resource.RLIMIT_AS, (-1, -1)))
""",
    )
    assert_blocked(r, "raise nproc", "raise as")


def test_project_modules_cannot_be_imported(box):
    r = run(
        box,
        """
import importlib
for name in ["tgc_rl", "tgc_rl.reward", "rlcore", "torch", "ray"]:
    attempt("import " + name, lambda name=name: importlib.import_module(name))
""",
    )
    assert_blocked(r, "import tgc_rl", "import tgc_rl.reward", "import rlcore", "import torch", "import ray")


def test_faking_a_sandbox_failure_is_just_a_failed_program(box):
    """A sandbox error would turn the sample into a verifier `error`; a program must not be able to."""
    r = run(box, 'sys.stderr.write("bwrap: Creating new namespace failed\\n")\nsys.exit(1)\n')
    assert (r.status, r.exit_code) == ("finished", 1)


# -- after the suite ------------------------------------------------------------------------------------
HOSTILE_RESPONSES = [
    "```python\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n```",
    "```python\nx = bytearray(1 << 34)\n```",
    f"```python\nimport os\nif os.fork() == 0:\n    os.setsid()\n"
    f"    os.execv('/usr/bin/sleep', ['{MARK}', '300'])\n```",
    "```python\nimport time\ntime.sleep(600)\n```",
    "```python\nprint('x' * (1 << 24))\n```",
    f"```python\nopen('{PROJECT}/pyproject.toml', 'a').write('pwned')\n```",
]


def test_the_reward_pool_scores_hostile_code_and_keeps_serving(no_new_children):
    spec = TaskSpec(
        name="code",
        params={"families": ["sum_line"], "timeout_s": 2.0},
        reward_workers=2,
        reward_timeout_s=30.0,
    )
    task = load_task("code", spec.params, 0)
    items = [task.item(i) for i in range(len(HOSTILE_RESPONSES) + 2)]
    with RewardPool(spec) as pool:
        scores = pool.score(items[: len(HOSTILE_RESPONSES)], HOSTILE_RESPONSES)
        assert [(s.status, s.reward) for s in scores] == [("ok", 0.0)] * len(HOSTILE_RESPONSES)
        good = pool.score(items[-2:], [f"```python\n{it.meta['reference']}```" for it in items[-2:]])
        assert [(s.status, s.reward) for s in good] == [("ok", 1.0), ("ok", 1.0)]
        assert pool.stats()["reward/workers_alive"] == 2


def test_the_sandbox_still_serves_after_the_suite(box):
    r = box.run("import sys\nprint(sum(map(int, sys.stdin.read().split())))", stdin="1 2 3")
    assert r.ok and r.stdout == "6\n"
