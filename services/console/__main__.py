"""Run the operator console: ``python -m services.console`` (port STATEFLEET_HTTP_PORT, default 8000)."""

from __future__ import annotations

from services.console.app import main

if __name__ == "__main__":
    main()
