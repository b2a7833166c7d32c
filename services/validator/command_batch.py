"""A user's command batch (POST /commands/batch, or a record on the domain's command batch
topic, ``account-command-batches`` for accounts) as pure functions: its envelope, and the
command each of its items becomes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.domain import MAX_ID_LENGTH, id_field_problem

#: Headers on a command split out of a batch: which batch, which item.
BATCH_ID_HEADER = "statefleet.batch.id"
BATCH_INDEX_HEADER = "statefleet.batch.index"


class MalformedBatch(ValueError):
    """A record on the command batch topic that is not a batch at all (it becomes a dead letter)."""


@dataclass(frozen=True, slots=True)
class CommandBatch:
    batch_id: str
    items: tuple[Any, ...]

    def command_ids(self) -> list[str]:
        return [item_command_id(self.batch_id, index, item) for index, item in enumerate(self.items)]


def parse_batch(obj: Mapping[str, Any], *, max_commands: int) -> CommandBatch:
    """Read a batch: ``{"batch_id": str, "commands": [item, ...]}``. Only the envelope is
    checked here; each item is decided on its own, like a single command."""
    problem = id_field_problem("batch_id", obj.get("batch_id"), required=True)
    if problem:
        raise MalformedBatch(problem)
    commands = obj.get("commands")
    if not isinstance(commands, list) or not commands:
        raise MalformedBatch("'commands' must be a non-empty list")
    if len(commands) > max_commands:
        raise MalformedBatch(f"a batch holds at most {max_commands} commands, got {len(commands)}")
    return CommandBatch(batch_id=obj["batch_id"], items=tuple(commands))


def item_command_id(batch_id: str, index: int, item: Any) -> str:
    """An item's command id: its own when it has a usable one, else derived from the batch id
    and its index, so a resent batch names each item the same again."""
    own = item.get("command_id") if isinstance(item, dict) else None
    if isinstance(own, str) and id_field_problem("command_id", own, required=True) is None:
        return own
    derived = f"{batch_id}:{index}"
    return derived if len(derived) <= MAX_ID_LENGTH else f"{batch_id[: MAX_ID_LENGTH - 12]}:{index}"


def batch_item(batch_id: str, index: int, item: dict[str, Any]) -> dict[str, Any]:
    """The command written for an item (its command id filled in)."""
    return {**item, "command_id": item_command_id(batch_id, index, item)}
