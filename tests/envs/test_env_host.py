"""Environments in worker processes beside the reward workers (tgc_rl/reward/env_host.py): calls to several
trajectories' environments at once, and a hung tool killed at the process level with only its slot lost."""

import os
import time

import pytest

from tgc_rl.config import TaskSpec
from tgc_rl.envs import EnvSpec, Message, StepResult
from tgc_rl.reward.env_host import EnvCall, EnvHost
from tgc_rl.tasks import TaskItem
from tgc_rl.tasks.grants import LOCAL_GRANTS

TASK = TaskSpec(name="arithmetic")
ITEM = TaskItem(id="a-0", prompt="What is 6 * 7?", answer="42", kind="math")


@pytest.fixture
def host():
    env = EnvSpec(name="calculator")
    h = EnvHost(TASK, env, 0, LOCAL_GRANTS)
    yield h
    h.close()


def test_calls_run_on_each_trajectorys_own_environment(host):
    resets = host.call([EnvCall(i, "reset", ITEM, 30.0) for i in range(2)])
    assert [r.kind for r in resets] == ["ok", "ok"]
    assert resets[0].value[-1] == Message("user", ITEM.prompt)
    a, b = host.call([EnvCall(0, "step", "<calc>6*7</calc>", 30.0), EnvCall(1, "step", "42", 30.0)])
    assert a.kind == "ok" and a.tool_calls == 1 and "42" in a.value.observation[0].content
    assert isinstance(b.value, StepResult) and b.value.done and b.value.reward == 1.0 and b.tool_calls == 0
    done = host.call([EnvCall(0, "step", "The answer is 41", 30.0)])[0]
    assert done.value.done and done.value.reward == 0.0 and done.tool_calls == 1


def test_a_hung_tool_is_killed_at_the_process_level_and_only_its_slot_is_lost():
    host = EnvHost(TASK, EnvSpec(name="tests.envs.hung_env:Spin"), 0, LOCAL_GRANTS)
    try:
        host.call([EnvCall(i, "reset", ITEM, 30.0) for i in range(2)])
        spinning = host._procs[0].proc.pid
        t0 = time.monotonic()
        killed, other = host.call([EnvCall(0, "step", "go", 0.5), EnvCall(1, "close", None, 5.0)])
        assert 1.4 < time.monotonic() - t0 < 10  # time left 0.5 s + the 1 s grace
        assert killed.kind == "killed" and "killed" in killed.value and other.kind == "ok"
        assert host.kills == 1 and spinning not in host.pids
        with pytest.raises(ProcessLookupError):
            os.kill(spinning, 0)
        assert host.call([EnvCall(0, "close", None, 5.0)])[0].kind == "ok"
        assert 0 not in host._procs  # closing a killed slot starts no worker
        assert host.call([EnvCall(0, "reset", ITEM, 30.0)])[0].kind == "ok"  # a fresh worker for the slot
    finally:
        host.close()


def test_an_environment_that_cannot_be_built_is_its_trajectorys_error():
    host = EnvHost(TASK, EnvSpec(name="tests.envs.no_such_module:Env"), 0, LOCAL_GRANTS)
    try:
        reply = host.call([EnvCall(0, "reset", ITEM, 30.0)])[0]
        assert reply.kind == "error" and "env.name" in reply.value
    finally:
        host.close()
