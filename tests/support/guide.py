"""The files a guide's code blocks are: a block with ``<!-- file: PATH -->`` on the line before
it is the file PATH (docs/your-domain.md: the tickets domain, its tests, the Containerfile of
the derived image), so that what the guide shows is what the tests run."""

from __future__ import annotations

import re
from pathlib import Path

FILE_BLOCK = re.compile(r"^<!-- file: (\S+) -->\n```\w*\n(.*?)^```$", re.S | re.M)


def guide_files(guide: Path) -> dict[str, str]:
    """The files ``guide``'s code blocks are, by path."""
    return dict(FILE_BLOCK.findall(guide.read_text()))


def write_files(files: dict[str, str], folder: Path) -> Path:
    """``files`` written under ``folder`` (their paths relative to it); returns ``folder``."""
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder
