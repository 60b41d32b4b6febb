"""A real headless Chromium (Debian's chromium + chromedriver) for the gateway page's tests."""

from __future__ import annotations

import shutil
import time

import pytest

from tests.support.paths import ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
ARTIFACTS = ROOT / "out" / "test-artifacts"  # screenshots


@pytest.fixture
def browser(tmp_path):
    if not (CHROMIUM and CHROMEDRIVER):  # `make test` installs both (Makefile SYSTEM_PACKAGES)
        pytest.fail("needs chromium and chromedriver: apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--mute-audio",
        "--autoplay-policy=no-user-gesture-required",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1000,800",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(condition, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")
