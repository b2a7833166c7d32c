"""Create the fleet's topics: ``python -m services.topics [--spec JSON] [--print]``."""

from __future__ import annotations

import sys

from services.topics.job import main

if __name__ == "__main__":
    sys.exit(main())
