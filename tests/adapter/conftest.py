"""The adapter tier: each model.py under the fake ``triton_python_backend_utils``
(tests/support/pb_utils.py), registered here once, before the tier's modules import a stage."""

from tests.support import pb_utils


def pytest_configure(config) -> None:
    pb_utils.install()
