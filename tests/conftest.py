"""Fixtures every test folder may use."""

import os

import pytest

from tests import image_build
from tests.proc_helpers import descendants, local_ray, wait_until


def pytest_collection_modifyitems(items):
    image_build.image_tests_last(items)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the session's first process, before any xdist worker starts
        image_build.prepare()


def pytest_collection_finish(session):
    if not session.config.option.collectonly and not hasattr(session.config, "workerinput"):
        image_build.start_if_selected([item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Under xdist the controller sees each worker's collection (all alike) and starts the build once."""
    image_build.start_if_selected(ids)


def pytest_sessionfinish(session):
    image_build.stop()


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
    from services.control.local import LocalControlPlane
    from tests.servers import ApiServer

    # One token per tenant serves a whole module's tests, some of them in bursts of hundreds: the request
    # rate and queued-job limits are off here (tests/control/test_limits.py tests them on servers of its own).
    cp = LocalControlPlane(tmp_path_factory.mktemp("cp"), ray_address="none",
                           env={"TGC_RATE_LIMIT_PER_S": "0", "TGC_MAX_QUEUED_JOBS": "0"})  # fmt: skip
    acme, globex, admin = (
        cp.create_token("acme"),
        cp.create_token("globex"),
        cp.create_token("ops", admin=True),
    )
    with cp:
        yield ApiServer(cp, acme, globex, admin)
