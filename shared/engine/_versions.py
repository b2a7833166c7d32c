"""The versions of Faust and aiokafka the engine is built for.

The engine reaches a few private parts of Faust's consumer and of aiokafka (all of them
in ``_faust.py``, the one adapter). Those can change between releases without notice,
so each is supported over a range of releases the suite has run on: the lock pins the
newest, and ``make test-lowest`` runs the unit, driver and one end-to-end file on the
lowest of each range. A worker refuses to start outside the ranges rather than fail
later in a way that loses or repeats records. ``pyproject.toml`` declares the same
ranges (a unit test keeps the two in step).

faust-streaming starts at 0.15.3: 0.13.2, the release before it, pins ``click<8.2``,
which uvicorn and the rest of the stack have left behind. aiokafka starts at 0.13.0: 0.12
lacks the protocol types (``RequestStruct``) that the identity check's Metadata request
is built from.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version


def release(text: str) -> tuple[int, ...]:
    """``"0.14.0"`` → ``(0, 14, 0)``: the numeric release of a version (a suffix such as
    ``rc1`` or ``.post1`` ends it)."""
    parts: list[int] = []
    for piece in text.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) < len(piece):
            break
    return tuple(parts)


@dataclass(frozen=True)
class Supported:
    """Releases from ``lowest`` (included) up to ``below`` (excluded)."""

    lowest: str
    below: str

    def __contains__(self, found: str) -> bool:
        return release(self.lowest) <= release(found) < release(self.below)

    def __str__(self) -> str:
        return f">={self.lowest},<{self.below}"


#: distribution name -> the releases supported
SUPPORTED = {"faust-streaming": Supported("0.15.3", "0.16"), "aiokafka": Supported("0.13.0", "0.15")}


class UnsupportedVersion(RuntimeError):
    pass


def installed(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def check_versions(found: dict[str, str | None] | None = None) -> None:
    """Raise :class:`UnsupportedVersion` naming every package whose installed version is outside its supported range."""
    found = found if found is not None else {name: installed(name) for name in SUPPORTED}
    wrong = [
        f"{name} {found.get(name) or 'not installed'} (supported: {wanted})"
        for name, wanted in SUPPORTED.items()
        if (have := found.get(name)) is None or have not in wanted
    ]
    if wrong:
        raise UnsupportedVersion(
            "statefleet's engine is built for "
            + ", ".join(f"{n}{v}" for n, v in SUPPORTED.items())
            + "; installed: "
            + "; ".join(wrong)
            + ". Install versions in those ranges (make venv installs the locked ones)."
        )
