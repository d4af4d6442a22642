import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "platform"))

import pytest  # noqa: E402


def ray_up():
    """A local Ray instance for the runner=ray tests (8 logical CPUs: every actor of a test fits), started on
    first use and shut down at the end of the session; tests that need their own cluster shut it down. Always a new
    instance (``address="local"``, as the runner starts one): without it ``ray.init`` joins any Ray cluster already
    running on the machine (``ray start``, or one a killed test session left) and refuses ``num_cpus``."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level="warning")
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
