import base64
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

import tgc_rl
from tgc_rl.sandbox import Sandbox, SandboxLimits, SandboxUnavailable
from tgc_rl.sandbox.bwrap import SANDBOX_ENV

PROJECT = Path(tgc_rl.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def box():
    return Sandbox(SandboxLimits(wall_s=10.0))


def test_runs_a_program_and_returns_its_output_and_exit_code(box):
    r = box.run("print('hello')\nraise SystemExit(3)")
    assert (r.stdout, r.exit_code, r.status, r.ok) == ("hello\n", 3, "finished", False)


def test_stdin_reaches_the_program(box):
    r = box.run("import sys\nprint(sum(map(int, sys.stdin.read().split())))", stdin="1 2 3\n4")
    assert r.ok and r.stdout == "10\n"


def test_large_stdin_is_delivered_whole(box):
    data = "x" * (3 << 20)
    r = box.run("import sys\nprint(len(sys.stdin.read()))", stdin=data)
    assert r.stdout == f"{len(data)}\n"


def test_traceback_shows_the_program_not_the_launcher(box):
    r = box.run("def f():\n    raise ValueError('boom')\nf()\n")
    assert r.exit_code == 1
    assert 'File "/tmp/main.py", line 3' in r.stderr and "ValueError: boom" in r.stderr
    assert "runpy" not in r.stderr and "_main" not in r.stderr


def test_program_runs_unprivileged_with_a_clean_environment(box):
    r = box.run(
        "import os, json\nprint(json.dumps([os.getuid(), os.getgid(), os.getcwd(), dict(os.environ)]))"
    )
    uid, gid, cwd, env = __import__("json").loads(r.stdout)
    assert (uid, gid, cwd) == (65534, 65534, "/tmp")
    assert {k: v for k, v in env.items() if k != "PWD"} == SANDBOX_ENV


def test_files_are_put_in_the_work_dir_and_fetched_back(box):
    r = box.run(
        "data = open('in/data.txt').read()\nopen('out.txt', 'w').write(data.upper())",
        files={"in/data.txt": b"hello"},
        fetch=["out.txt", "never-written.txt"],
    )
    assert r.ok
    assert r.files == {"out.txt": base64.b64encode(b"HELLO").decode()}


def test_each_run_gets_a_fresh_work_dir(box):
    assert box.run("open('left-behind', 'w').write('x')").ok
    assert box.run("import os\nprint(os.listdir('.'))").stdout == "['main.py']\n"


def test_bash_programs_run(box):
    r = box.run('read x; echo "got $x"; exit 4', language="bash", stdin="7\n")
    assert (r.stdout, r.exit_code) == ("got 7\n", 4)


def test_concurrent_runs_stay_separate(box):
    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda i: box.run("print(input() * 2)", stdin=f"{i}\n"), range(8)))
    assert [r.stdout for r in results] == [f"{i}{i}\n" for i in range(8)]


def test_unsupported_language_is_refused_naming_it(box):
    with pytest.raises(ValueError, match="language 'cobol' is not supported"):
        box.run("x", language="cobol")


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "a/../../b", ""])
def test_paths_outside_the_work_dir_are_refused(box, path):
    with pytest.raises(ValueError, match="files"):
        box.run("pass", files={path: b"x"})


def test_fetch_paths_outside_the_work_dir_are_refused(box):
    with pytest.raises(ValueError, match="fetch_files"):
        box.run("pass", fetch=["../../etc/shadow"])


def test_runs_are_counted_in_prometheus(box):
    def count(status):
        return REGISTRY.get_sample_value("tgc_sandbox_runs_total", {"status": status}) or 0.0

    finished, timeouts = count("finished"), count("timeout")
    box.run("pass")
    box.run("import time\ntime.sleep(5)", limits=box.limits.replace(wall_s=0.5))
    assert (count("finished"), count("timeout")) == (finished + 1, timeouts + 1)


@pytest.mark.parametrize("field,value", [("wall_s", 0), ("memory_mb", -1), ("processes", 0), ("cpu_s", 1.5)])
def test_invalid_limits_are_refused_naming_the_limit(field, value):
    with pytest.raises(ValueError, match=field):
        SandboxLimits(**{field: value})


def test_unknown_limit_is_refused():
    with pytest.raises(ValueError, match="unknown sandbox limit"):
        SandboxLimits().replace(wall=3)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unsafe_local"):
        Sandbox(mode="docker")


def test_an_interpreter_that_does_not_exist_is_refused_naming_it():
    with pytest.raises(SandboxUnavailable, match="/no/such/python3"):
        Sandbox(python="/no/such/python3")


def test_missing_bwrap_is_refused_with_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.delenv("TGC_BWRAP", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap") as e:
        Sandbox()
    assert "unsafe_local" in str(e.value)


def test_missing_user_namespaces_are_refused_with_how_to_enable_them():
    """Inside a real bwrap with nested user namespaces disabled, the sandbox refuses to run unconfined."""
    probe = "from tgc_rl.sandbox import Sandbox\nSandbox()\n"
    # The fresh /tmp hides a checkout (or an interpreter) that lives under /tmp: bind those back on top.
    under_tmp = {
        p
        for p in (PROJECT, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve())
        if Path("/tmp") in p.parents
    }
    cmd = [
        "bwrap",
        "--unshare-user",
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--disable-userns",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
        *[arg for p in sorted(under_tmp) for arg in ("--ro-bind", str(p), str(p))],
        "--chdir",
        str(PROJECT),
        "--",
        sys.executable,
        "-c",
        probe,
    ]
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0
    assert "SandboxUnavailable" in r.stderr
    assert "user namespaces" in r.stderr and "unsafe_local" in r.stderr


def test_unsafe_local_mode_warns_loudly_and_still_applies_limits():
    with pytest.warns(RuntimeWarning, match="UNSAFE"):
        box = Sandbox(SandboxLimits(wall_s=1.0), mode="unsafe_local")
    r = box.run("import os\nprint(os.getcwd())")
    assert r.ok and r.isolation == "unsafe_local"
    assert not Path(r.stdout.strip()).exists()  # its temp work dir is removed
    assert box.run("import time\ntime.sleep(30)").status == "timeout"
    assert "MemoryError" in box.run("bytearray(1 << 40)").stderr
