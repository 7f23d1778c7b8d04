"""The managed local Ray head: stop() ends every process it started, including those that do not name its
temp dir (the Ray client-server proxy)."""

import os

import psutil
import pytest

from services.control.ray_cluster import LocalRayCluster

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
