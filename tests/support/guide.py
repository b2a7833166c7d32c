"""The files a guide's code blocks are: a block with ``<!-- file: PATH -->`` on the line before
it is the file PATH (docs/your-domain.md: the tickets domain and projection, their tests, the
Containerfile of the derived image), so that what the guide shows is what the tests run; and
that derived image laid out as its Containerfile builds it (:func:`derived_image`)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FILE_BLOCK = re.compile(r"^<!-- file: (\S+) -->\n```\w*\n(.*?)^```$", re.S | re.M)


def guide_files(guide: Path) -> dict[str, str]:
    """The files ``guide``'s code blocks are, by path."""
    return dict(FILE_BLOCK.findall(guide.read_text()))


#: The guide of a team's own domain and projection: its code blocks are files the tests run.
DOMAIN_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "your-domain.md"


def domain_guide_files(*needed: str) -> dict[str, str]:
    """The files of :data:`DOMAIN_GUIDE`'s code blocks, by path; ``needed`` must be among them."""
    files = guide_files(DOMAIN_GUIDE)
    assert set(needed) <= files.keys(), f"the guide's files are {sorted(files)}"
    return files


def write_files(files: dict[str, str], folder: Path) -> Path:
    """``files`` written under ``folder`` (their paths relative to it); returns ``folder``."""
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def derived_image(tmp: Path, files: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """The guide's derived image without a build: ``files`` as its build context, the
    Containerfile's COPY lines applied under ``tmp/root`` (the image's ``/``), and the
    environment its ENV lines set, with the image's paths in PYTHONPATH under that root."""
    context, root = write_files(files, tmp / "context"), tmp / "root"
    env: dict[str, str] = {}
    for line in files["Containerfile"].replace("\\\n", " ").splitlines():
        instruction, _, rest = line.strip().partition(" ")
        if instruction == "FROM":
            assert rest.startswith("statefleet:"), f"the recipe derives from statefleet's image, not {rest}"
        elif instruction == "COPY":
            source, target = rest.split()
            shutil.copytree(context / source, root / target.lstrip("/"))
        elif instruction == "ENV":
            env.update(pair.partition("=")[::2] for pair in shlex.split(rest))
        elif instruction:
            pytest.fail(f"the recipe's test lays out FROM, COPY and ENV, not {instruction}")
    env["PYTHONPATH"] = os.pathsep.join(str(root / entry.lstrip("/")) for entry in env["PYTHONPATH"].split(":"))
    return root, env


def with_project(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the project's own packages importable after the team's (the image's app)."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [env["PYTHONPATH"], os.environ.get("PYTHONPATH")]))}


def stopped_at_start(module: str, path: str, change: tuple[str, str], tmp: Path) -> str:
    """Run ``python -m module`` in the derived image of :data:`DOMAIN_GUIDE` with one text of
    the guide's file ``path`` replaced (``change``: old, new), with nothing but the image's
    environment, as a worker that must stop at start: it exits 1 without a traceback. Returns
    what it printed on stderr."""
    files = domain_guide_files(path, "Containerfile")
    assert change[0] in files[path], f"{path} has no {change[0]!r}"
    files[path] = files[path].replace(*change)
    _, image_env = derived_image(tmp, files)
    proc = subprocess.run(
        [sys.executable, "-m", module],
        cwd=DOMAIN_GUIDE.parents[1],
        env={"PATH": "/usr/bin:/bin", **with_project(image_env)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr
