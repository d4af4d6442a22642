import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "platform"))

import pytest  # noqa: E402


_RAY_ROOT = []  # the test session's own directory for the Ray instances tests start


def ray_root() -> str:
    """A short directory of the test session's own for the Ray instances the tests start themselves (the shared
    one below, a cluster's nodes): Ray would keep each one's session in /tmp/ray for good (five a test session).
    Removed at the session's end. (Runs of the laglab runner that start their own instance make their own.)"""
    if not _RAY_ROOT:
        _RAY_ROOT.append(tempfile.mkdtemp(prefix="lgt", dir="/tmp"))
    return _RAY_ROOT[0]


def ray_up():
    """A local Ray instance for the runner=ray tests (8 logical CPUs: every actor of a test fits), started on
    first use and shut down at the end of the session; tests that need their own cluster shut it down. Always a new
    instance (``address="local"``, as the runner starts one): without it ``ray.init`` joins any Ray cluster already
    running on the machine (``ray start``, or one a killed test session left) and refuses ``num_cpus``."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level="warning",
                 _temp_dir=ray_root())
    return ray


@pytest.fixture(autouse=True)
def _ray_for_ray_runner_tests(request):
    cs = getattr(request.node, "callspec", None)
    if cs is not None and str(cs.params.get("runner", "")).startswith("ray"):
        ray_up()
    yield


def pytest_sessionfinish(session, exitstatus):
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    for root in _RAY_ROOT:
        shutil.rmtree(root, ignore_errors=True)
