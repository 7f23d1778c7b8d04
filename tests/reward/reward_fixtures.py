"""Custom rewards (`task.reward: tests.reward.reward_fixtures:<name>`) the pool tests run in real workers.

`judge` misbehaves on request, by response text, so one pool can exercise every failure mode.
"""

import ctypes
import os
import sys
import time

from tgc_rl.tasks.base import Score

# sympy never finishes comparing this power tower with a symbolic reference. The reference must not be a
# plain number: a numeric reference needs a numeric answer, which refuses the tower before sympy sees it.
HANGING_MATH = ("\\sqrt{5}", "\\boxed{9^{9^{9^{9}}}}")  # (reference, response)


def exact(item, response):
    return float(response.strip() == (item.answer or ""))


def _hang():
    while True:
        time.sleep(1)


def _crash():
    ctypes.string_at(0)  # a null read: SIGSEGV kills the worker process


def _chatty():
    """Writes to stdout and to fd 1: neither may corrupt the worker's protocol."""
    print("noise on stdout " * 100)
    os.write(1, b"\x00\x00\x00\x05garbage")
    return 1.0


BEHAVIOURS = {
    "hang": _hang,
    "crash": _crash,
    "raise": lambda: (_ for _ in ()).throw(RuntimeError("cannot judge this")),
    "wrong-type": lambda: "yes",
    "nan": lambda: float("nan"),
    "exit": lambda: sys.exit(3),
    "chatty": _chatty,
    "graded": lambda: Score(0.5, detail="half credit"),
    "pid": lambda: float(os.getpid()),
    "slow": lambda: time.sleep(1.0) or 1.0,
}


def judge(item, response):
    behaviour = BEHAVIOURS.get(response)
    if behaviour is not None:
        return behaviour()
    return exact(item, response)


not_callable = 42
