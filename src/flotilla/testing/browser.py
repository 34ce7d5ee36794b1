"""Headless Chromium for the console's browser tests and bench/console.py (Debian's chromium and
chromium-driver, driven by Selenium; no browser is downloaded).

The flags keep Chromium off the network except for the page under test: without the background-networking
ones a closed network makes it try (and refuse) many connections, which slows every page load.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

CHROMIUM = os.environ.get("FLOTILLA_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("FLOTILLA_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1440,900")


def available() -> str | None:
    """None when Chromium, chromedriver and Selenium are installed, else what is missing."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (Path(p).exists() or shutil.which(p))]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium Python package")
    return ", ".join(missing) or None


@contextmanager
def chromium(width: int = 1440, height: int = 900) -> Iterator[Any]:
    """A Selenium WebDriver on a fresh headless Chromium with an empty profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="flotilla-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={profile}")
        options.add_argument(f"--window-size={width},{height}")
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def sign_in(driver: Any, base: str, token: str) -> None:
    """Open the console and enter `token` in its sign-in form, as a person would."""
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/ui/")
    field = wait(driver, lambda d: d.find_element(By.ID, "token") if d.find_element(By.ID, "token").is_displayed()
                 else None, "the sign-in form")
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").click()
    wait(driver, lambda d: d.execute_script("return document.body.dataset.role || null"), "signed in")


def wait(driver: Any, until: Callable[[Any], Any], what: str, timeout: float = 20.0, interval: float = 0.1) -> Any:
    """Poll `until(driver)` until it returns something true; exceptions count as not yet."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = until(driver)
            if last:
                return last
        except Exception as e:  # an element not there yet, a stale one after a redraw
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
