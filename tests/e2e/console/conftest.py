"""The fleet, the console and a real headless Chromium for the console's browser tests.

Chromium is Debian's ``chromium`` package (``.ci/run`` installs it), driven by
Playwright through its executable path; Playwright's own browser download is never
used. One fleet (its own topic prefix, free ports) serves every test of the module.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.e2e.console.realistic import ORDERED_ORIGIN
from tests.support.environment import service_environment, settings_env
from tests.support.kafka import create_topics
from tests.support.services import REPO, ServiceProcess

CHROMIUM = os.environ.get("STATEFLEET_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = REPO / ".local" / "screenshots" / "console"
TOKEN = "console-test-token"

T = TypeVar("T")


def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn`` in a thread of its own: Playwright's sync API keeps an event loop running
    in the test's thread, and the Kafka helpers start theirs with asyncio.run."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn, *args, **kwargs).result()


@dataclass
class ConsoleFleet:
    prefix: str
    validator: ServiceProcess
    tallies: ServiceProcess
    retry_scheduler: ServiceProcess
    console: ServiceProcess

    def topic(self, base: str) -> str:
        return f"{self.prefix}{base}"


@pytest.fixture(scope="module")
def console_fleet(kafka_bootstrap: str, module_prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleFleet]:
    tmp = tmp_path_factory.mktemp("console")
    prefix = module_prefix
    env = service_environment(
        kafka_bootstrap,
        prefix,
        tmp / "data",
        log_level=None,
        topic_partitions=4,
        admin_token=TOKEN,
        tally_publish_interval_s=0.2,
        retry_tick_interval_s=0.2,
        # The first attempt waits minutes, so the poison message is still scheduled when the
        # page looks; the second failure parks it.
        retry_max_attempts=2,
        retry_base_delay_ms=600000,
        # Ordered retries for one topic of the tests' own: other origin topics are unchanged.
        retry_ordered_topics=ORDERED_ORIGIN,
    )
    off_loop(create_topics, [f"{prefix}retry"], partitions=4)
    services = {
        name: ServiceProcess(name, {**env, "STATEFLEET_INSTANCE_ID": f"{name}-0"}, tmp / f"{name}.log").start()
        for name in ("validator", "tallies", "retry_scheduler")
    }
    console_env = {
        **env,
        **settings_env(
            console_validator_url=services["validator"].url,
            console_tallies_url=services["tallies"].url,
            console_retry_scheduler_url=services["retry_scheduler"].url,
            console_sample_interval_s=1,
            console_refresh_s=1,
        ),
    }
    console = ServiceProcess("console", console_env, tmp / "console.log").start()
    running = [*services.values(), console]
    try:
        for proc in running:
            proc.wait_ready(timeout=120)
        yield ConsoleFleet(prefix, services["validator"], services["tallies"], services["retry_scheduler"], console)
    finally:
        for proc in running:
            proc.stop()


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """The browser, for this module only: Playwright's sync API keeps an event loop running in
    the main thread while it is open, which the async tests of other modules could not share."""
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"the console's browser tests need Chromium at {CHROMIUM}: install Debian's package "
            "(`sudo apt-get install -y chromium`; .ci/run does) or set STATEFLEET_CHROMIUM to a Chromium binary",
            pytrace=False,
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def browser_session(chromium, console_fleet: ConsoleFleet, viewport: dict[str, int]):  # type: ignore[no-untyped-def]
    """A fresh browser session (no admin token) on the console, in a window of ``viewport``'s size."""
    context = chromium.new_context(base_url=console_fleet.console.url, viewport=viewport)
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()


@pytest.fixture
def page(chromium, console_fleet: ConsoleFleet):  # type: ignore[no-untyped-def]
    """A fresh browser session (no admin token) on the console, laptop-sized."""
    with browser_session(chromium, console_fleet, {"width": 1366, "height": 860}) as page:
        yield page


def screenshot(page, name: str) -> Path:  # type: ignore[no-untyped-def]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
