"""Fixtures every test folder may use."""

import os

import pytest

from tests import image_build, scheduling
from tests.proc_helpers import descendants, local_ray, wait_until

_durations: scheduling.DurationRecorder | None = None  # in the session's first process, when asked for


def pytest_collection_modifyitems(items):
    # every xdist worker collects and orders alike; the controller hands out the files in this order
    scheduling.order_files(items, workers=int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def pytest_configure(config):
    global _durations
    # xdist's controller hands files out in the collection's order (tests/scheduling.py: longest first), not
    # re-sorted by their number of tests (xdist's default). Set in every process, so a test sees what the
    # controller uses.
    config.option.loadscopereorder = False
    if hasattr(config, "workerinput") and hasattr(os, "sched_setaffinity"):
        # before this worker imports torch: its thread pool and all it starts stay on its own CPUs
        worker = config.workerinput
        scheduling.pin_worker(int(worker["workerid"].removeprefix("gw")), int(worker["workercount"]))
    if not hasattr(config, "workerinput"):  # the session's first process, before any xdist worker starts
        image_build.prepare()
        _durations = scheduling.recorder_from_environment()


def pytest_runtest_logreport(report):
    if _durations is not None:  # the controller sees every worker's reports
        _durations.add(report)


def pytest_collection_finish(session):
    if not session.config.option.collectonly and not hasattr(session.config, "workerinput"):
        image_build.start_if_selected([item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Under xdist the controller sees each worker's collection (all alike) and starts the build once."""
    image_build.start_if_selected(ids)


def pytest_sessionfinish(session):
    image_build.stop()
    if _durations is not None and not session.config.option.collectonly:
        _durations.write()


@pytest.fixture
def no_new_children():
    """Asserts that a test leaves no process of its own behind."""
    before = descendants(os.getpid())
    yield
    assert wait_until(lambda: not (descendants(os.getpid()) - before), timeout=10), (
        f"stray processes: {descendants(os.getpid()) - before}"
    )


@pytest.fixture(scope="session")
def make_batch():
    """Factory: make_batch(n_groups=4, group_size=4, seed=0, objective="cp_grpo", ...) -> TrainBatch."""
    from tests.batches import build_batch

    return build_batch


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray in this process for the module (one another module left running is used as it is)."""
    yield from local_ray(object_store_memory=256 * 2**20)


@pytest.fixture(scope="module")
def api_server(tmp_path_factory):
    """A control plane without Ray for the module (tests/servers.py): jobs stay queued, the rest is real."""
    from tests.servers import ApiServer
    from tgc_rl.control.local import LocalControlPlane

    # One token per tenant serves a whole module's tests, some of them in bursts of hundreds: the request
    # rate and queued-job limits are off here (tests/control/test_limits.py tests them on servers of its own).
    cp = LocalControlPlane(
        tmp_path_factory.mktemp("cp"),
        ray_address="none",
        env={"TGC_RATE_LIMIT_PER_S": "0", "TGC_MAX_QUEUED_JOBS": "0"},
    )
    acme, globex, admin = (
        cp.create_token("acme"),
        cp.create_token("globex"),
        cp.create_token("ops", admin=True),
    )
    with cp:
        yield ApiServer(cp, acme, globex, admin)
