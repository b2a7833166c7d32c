"""Run one retry scheduler instance: ``python -m services.retry_scheduler``."""

from __future__ import annotations

from services.retry_scheduler.runtime import build, main

__all__ = ["build"]

if __name__ == "__main__":
    main()
