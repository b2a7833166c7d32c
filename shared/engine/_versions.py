"""The versions of Faust and aiokafka the engine is built for.

The engine replaces parts of Faust's consumer and reads private state of Faust and
aiokafka (all of them in ``_faust.py``). Those parts change between
releases without notice, so a worker refuses to start on any other version rather
than fail later in a way that loses or repeats records.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

#: distribution name -> the one version supported
SUPPORTED = {"faust-streaming": "0.15.3", "aiokafka": "0.14.0"}


class UnsupportedVersion(RuntimeError):
    pass


def installed(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def check_versions(found: dict[str, str | None] | None = None) -> None:
    """Raise :class:`UnsupportedVersion` naming every package whose installed version is not the supported one."""
    found = found if found is not None else {name: installed(name) for name in SUPPORTED}
    wrong = [
        f"{name} {found.get(name) or 'not installed'} (supported: {wanted})"
        for name, wanted in SUPPORTED.items()
        if found.get(name) != wanted
    ]
    if wrong:
        raise UnsupportedVersion(
            "statefleet's engine relies on internals of exactly "
            + ", ".join(f"{n}=={v}" for n, v in SUPPORTED.items())
            + "; installed: "
            + "; ".join(wrong)
            + ". Install the pinned versions (make venv installs them)."
        )
