"""The first code that runs inside the sandbox: set the rlimits, then run the program.

This file is sent as `python -I -S -B -c <source> <mode> <workdir> <rlimits> <fetch> <program argv...>`;
it must only use the standard library and define nothing the program could rely on. rlimits are set
here, inside the new user namespace, rather than on bwrap: RLIMIT_NPROC then counts the processes of
this run only, not every process the host user owns, and bwrap itself is not bound by them.

Arguments: `mode` is `runpy` (run a Python file in this interpreter: one interpreter start instead of
two) or `exec`; `rlimits` is `RLIMIT_X=soft:hard,...`; `fetch` is empty or `fd:limit:path\\npath...`
(files sent back as JSON on that fd after the program ends). Imports are kept to what startup already
loads (json, runpy, traceback only when needed): each import is paid on every sandboxed run.
"""

import os
import resource
import sys


def _main() -> None:
    mode, workdir, limits, fetch = sys.argv[1:5]
    argv = sys.argv[5:]
    for spec in limits.split(","):
        name, _, values = spec.partition("=")
        soft, _, hard = values.partition(":")
        resource.setrlimit(getattr(resource, name), (int(soft), int(hard)))
    os.chdir(workdir)
    if fetch:
        fd, limit, paths = fetch.split(":", 2)
        _run_then_fetch(argv, paths.split("\n"), int(fd), int(limit))
    if mode == "runpy":
        _run_python(argv)
        return
    os.execv(argv[0], argv)


def _run_python(argv: list) -> None:
    """Run a script as `__main__` the way `python script.py` would, minus a second interpreter start."""
    path = argv[0]
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(path))
    main = type(sys)("__main__")
    main.__file__ = path
    sys.modules["__main__"] = main  # so pickle and friends find the program's own definitions
    try:
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec")
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:  # print the traceback as a plain `python main.py` would: no launcher frames
        import traceback

        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        sys.exit(1)


def _run_then_fetch(argv: list, paths: list, fetch_fd: int, limit: int) -> None:
    """Run the program as a child, then send the requested files back (the program never sees the fd)."""
    import base64
    import json

    os.set_inheritable(fetch_fd, False)
    pid = os.fork()
    if pid == 0:
        os.close(fetch_fd)
        if argv[0].endswith(".py"):
            argv = [sys.executable, "-I", "-S", "-B", *argv]
        os.execv(argv[0], argv)
    _, status = os.waitpid(pid, 0)
    files, budget = {}, limit
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read(budget + 1)
        except OSError:
            continue
        if len(data) > budget:
            break
        budget -= len(data)
        files[path] = base64.b64encode(data).decode()
    payload = json.dumps(files).encode()
    while payload:
        payload = payload[os.write(fetch_fd, payload) :]
    os.close(fetch_fd)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    _main()
