"""Run one validator instance: ``python -m services.validator``."""

from __future__ import annotations

from services.validator.runtime import build, main

__all__ = ["build"]

if __name__ == "__main__":
    main()
