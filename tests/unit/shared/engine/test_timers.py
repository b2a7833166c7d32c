"""A timer run that raises is logged, not a crash of the worker: the next run comes as usual."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from shared.engine import Engine
from shared.settings import Settings


def test_an_exception_out_of_a_timer_is_logged_and_the_timer_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine("probe", Settings(data_dir=tmp_path), 8999)
    # The engine hands Faust's timer an ``async def``: what it registers returns a coroutine.
    registered: list[Callable[[], Coroutine[Any, Any, None]]] = []

    def fake_timer(interval_s: float, name: str) -> Callable[[Callable[[], Coroutine[Any, Any, None]]], Any]:
        def register(fn: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], Coroutine[Any, Any, None]]:
            registered.append(fn)
            return fn

        return register

    engine._faust_app.timer = fake_timer  # type: ignore[method-assign,assignment]
    runs: list[int] = []

    async def publish() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise ConnectionError("Connect call failed ('127.0.0.1', 9092)")

    engine.timer(0.5, name="publish")(publish)
    [run] = registered
    with caplog.at_level(logging.WARNING):
        asyncio.run(run())  # does not raise
        asyncio.run(run())
    assert runs == [0, 1]
    assert "probe timer 'publish' failed (runs again in 0.5s): ConnectionError" in caplog.text
