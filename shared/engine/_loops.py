"""The engine's background loops: a step run at a steady interval until told to stop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def run_every(
    interval_s: float, step: Callable[[], Awaitable[None]], running: Callable[[], bool], failed: Callable[[Exception], None]
) -> None:
    """Run ``step`` every ``interval_s`` (from the start of one run to the next) while
    ``running()``; a step that raises is reported to ``failed`` and the loop goes on."""
    loop = asyncio.get_running_loop()
    while running():
        started = loop.time()
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failed(exc)
        await asyncio.sleep(max(0.0, started + interval_s - loop.time()))
