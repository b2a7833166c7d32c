"""Reading an operator's YAML file (a retry policy, the API tokens) with errors that say what to fix."""

from __future__ import annotations

from typing import Any

import yaml


def load_yaml_file(path: str, source: str, error: type[Exception], *, quote_errors: bool = True) -> Any:
    """The document in ``path``, or ``error`` naming ``source`` and what is wrong: unreadable, not
    UTF-8, not YAML. ``quote_errors=False`` leaves out yaml's message, which quotes the lines
    around the error (a file of secrets)."""
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except OSError as exc:
        raise error(f"{source}: cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{source}: is not UTF-8 text: {exc.reason}") from None
    except yaml.YAMLError as exc:
        detail = f": {' '.join(str(exc).split())}" if quote_errors else ""
        raise error(f"{source}: is not valid YAML{detail}") from None
