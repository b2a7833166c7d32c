"""Run one tallies instance: ``python -m services.tallies``."""

from __future__ import annotations

from services.tallies.runtime import build, main

__all__ = ["build"]

if __name__ == "__main__":
    main()
