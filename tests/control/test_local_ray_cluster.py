"""The managed local Ray head: stop() ends every process it started, including those that do not name its
temp dir (the Ray client-server proxy)."""

import os

import psutil
import pytest

from tgc_rl.control.ray_cluster import LocalRayCluster

pytestmark = pytest.mark.slow


def _session_members(sid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return found


def test_stop_leaves_no_process_of_the_head_behind(tmp_path):
    head = LocalRayCluster(tmp_path, num_cpus=1)
    try:
        head.ensure()
        saved = head._saved()
        members = _session_members(saved["session"])
        assert any("ray.util.client.server" in " ".join(p.cmdline()) for p in members)
        assert {p.pid for p in members} <= {p.pid for p in head.processes()}  # the proxy included
    finally:
        head.stop()
    assert _session_members(saved["session"]) == []
    assert not head.temp_dir.exists() and not head.running()


def test_a_head_whose_daemons_died_is_gone_and_its_leftovers_are_still_stopped(tmp_path):
    head = LocalRayCluster(tmp_path, num_cpus=1)
    try:
        head.ensure()
        session = head._saved()["session"]
        for p in head.core_processes():  # as if the OOM killer took the head's daemons
            p.kill()
        psutil.wait_procs(head.core_processes(), timeout=10)
        assert head.core_processes() == []  # the scheduler's test of a dead head
        lingering = _session_members(session)
        assert {p.pid for p in lingering} <= {p.pid for p in head.processes()}
    finally:
        head.stop()
    assert _session_members(session) == []


def test_tgc_cluster_stop_ends_the_head_that_tgc_serve_leaves_running(tmp_path, capsys):
    from tgc_rl.cli import main

    head = LocalRayCluster(tmp_path, num_cpus=1)
    try:
        head.ensure()
        session = head._saved()["session"]
        assert main(["cluster", "status", "--data-dir", str(tmp_path)]) == 0
        assert "dashboard http" in capsys.readouterr().out
        assert main(["cluster", "stop", "--data-dir", str(tmp_path)]) == 0
        assert "stopped the managed Ray head" in capsys.readouterr().out
        assert _session_members(session) == [] and not head.running()
    finally:
        head.stop()
