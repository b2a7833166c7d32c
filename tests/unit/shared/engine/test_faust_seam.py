"""Faust's and aiokafka's private parts are reached from ``shared/engine/_faust.py`` alone.

ruff's SLF001 (off for that module only) catches reads of another object's private
attributes; this catches what it cannot see: an engine class that overrides a private method
of a Faust, mode or aiokafka base class, or uses one through ``self``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
from pathlib import Path

import shared.engine

ENGINE = Path(shared.engine.__file__).parent
ADAPTER = "_faust.py"
THIRD_PARTY = ("faust", "mode", "aiokafka")


@functools.cache
def _defined_by(base: type) -> frozenset[str]:
    """Names a class defines: its attributes, and those its methods set on ``self``."""
    try:
        source = inspect.getsource(base)
    except (OSError, TypeError):  # built in, or generated
        source = ""
    return frozenset(vars(base)) | frozenset(re.findall(r"self\.(_[A-Za-z0-9_]+)\s*(?::[^=\n]*)?=", source))


def _third_party_private(cls: type, name: str) -> str | None:
    """The third-party base class of ``cls`` that defines ``name``, if one does."""
    for base in cls.__mro__[1:]:
        if base.__module__.split(".")[0] in THIRD_PARTY and name in _defined_by(base):
            return f"{base.__module__}.{base.__qualname__}"
    return None


def _private_uses(path: Path) -> list[str]:
    """Private names of third-party bases that classes in ``path`` define or use on ``self``."""
    module = importlib.import_module(f"shared.engine.{path.stem}")
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(module, node.name, None)
        if not inspect.isclass(cls):
            continue
        names: set[str] = set()
        for child in ast.walk(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(child.name)
            elif isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name) and child.value.id == "self":
                names.add(child.attr)
        for name in sorted(names):
            if name.startswith("_") and not name.startswith("__"):
                base = _third_party_private(cls, name)
                if base is not None:
                    found.append(f"{path.name}: {node.name}.{name} (private in {base})")
    return found


def test_only_the_adapter_touches_private_steps_of_faust_and_aiokafka() -> None:
    modules = sorted(p for p in ENGINE.glob("*.py") if p.name not in (ADAPTER, "__init__.py"))
    assert len(modules) > 10
    found = [use for path in modules for use in _private_uses(path)]
    assert found == [], "move these behind a hook in shared/engine/_faust.py:\n" + "\n".join(found)


def test_the_check_sees_overrides_and_self_uses() -> None:
    # The adapter itself overrides and uses them: the check finds them there.
    found = _private_uses(ENGINE / ADAPTER)
    assert any("ConsumerHooks._drain_messages" in use for use in found)
    assert any("ConsumerHooks._read_offset" in use for use in found)
    assert any("RecoveryHooks._build_highwaters" in use for use in found)
