"""How the validator's state is kept in RocksDB (Faust tables with raw bytes keys and values).

``accounts`` (partitioned like the domain's command topic, by aggregate id; the table keeps
its name whatever the domain)
    key the aggregate id; value JSON ``{"v": version, "a": state|null, "h": [[command_id,
    code], ...]}``, ``a`` the domain's ``state_to_json``. ``a`` is null (and ``v`` 0) for an
    id that never existed but has answered commands (rejections are remembered too). ``h``
    holds the last ``command_history_per_account`` command ids, oldest first, each with its
    event's version or its rejection reason. Rows the accounts-only validator wrote before
    (``{"s": status|null, "v", "p", "d", "h"}``) are read as the accounts domain's.

``outcomes`` (partitioned by command_id)
    key ``command_id``; value the outcome record JSON (see ``outcome_records.outcome_record``).
    ``EXPIRY_PREFIX`` + expires_at (8 bytes, big-endian, sign-flipped, epoch ms) +
    command_id → empty: one per outcome row, written with the row's first version, so
    a seek from the prefix finds the rows to delete oldest first.

``program-accounts`` (partitioned by program_id: the category projection)
    ``L`` + program_id + NUL + created_at (8 bytes, big-endian, sign-flipped) + account_id
    → listing row JSON ``{"a","s","v","c","u"}``; the keys of one program sort oldest
    first, so a backwards scan lists newest first. ``I`` + program_id + NUL + account_id
    → the 8 created_at bytes, to find an account's listing row when it changes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

from services.validator.listing import Listing
from shared import codecs
from shared.domain import Aggregate, Domain, OutcomeCode, Row

SEPARATOR = b"\x00"
LISTING_PREFIX = b"L"
INDEX_PREFIX = b"I"
_SIGN = 1 << 63
_U64 = struct.Struct(">Q")


# -- accounts ---------------------------------------------------------------------------------


def aggregate_key(aggregate_id: str) -> bytes:
    return aggregate_id.encode()


def encode_state(domain: Domain[Any], row: Row[Any]) -> bytes:
    history = [[cid, code] for cid, code in row.history.items()]
    aggregate = row.aggregate
    if aggregate is None:
        return codecs.dumps({"v": 0, "a": None, "h": history})
    return codecs.dumps({"v": aggregate.version, "a": domain.state_to_json(aggregate.state), "h": history})


def decode_state(domain: Domain[Any], aggregate_id: str, raw: bytes) -> Row[Any]:
    obj = codecs.loads_object(raw)
    history: dict[str, OutcomeCode] = {cid: code for cid, code in obj.get("h", [])}
    state = obj["a"] if "a" in obj else _legacy_account(obj)
    if state is None:
        return Row(aggregate=None, history=history)
    return Row(aggregate=Aggregate(aggregate_id, obj["v"], domain.state_from_json(state)), history=history)


def _legacy_account(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The state of a row written before the domain API (accounts only), as the accounts domain stores it."""
    if obj.get("s") is None:
        return None
    return {"program_id": obj["p"], "status": obj["s"], "data": obj.get("d") or {}}


# -- outcomes ---------------------------------------------------------------------------------

EXPIRY_PREFIX = b"\x00expires\x00"


def outcome_status(raw: bytes) -> str:
    status = codecs.loads_object(raw).get("status")
    return status if isinstance(status, str) else ""


def expiry_key(expires_at: int, command_id: bytes) -> bytes:
    return EXPIRY_PREFIX + pack_ts(expires_at) + command_id


def split_expiry_key(key: bytes) -> tuple[int, bytes]:
    """(expires_at, command_id) of an expiry index key."""
    body = key[len(EXPIRY_PREFIX) :]
    return unpack_ts(body[:8]), body[8:]


def expired(index_keys: Iterable[bytes], now: int, limit: int) -> list[tuple[bytes, bytes]]:
    """(index key, command_id) of the first ``limit`` expiry rows due by ``now``, from
    keys in ascending order (those past the expiry rows are ignored)."""
    out: list[tuple[bytes, bytes]] = []
    for key in index_keys:
        if len(out) >= limit or not key.startswith(EXPIRY_PREFIX):
            break
        expires_at, command_id = split_expiry_key(key)
        if expires_at > now:
            break
        out.append((key, command_id))
    return out


# -- the category projection -------------------------------------------------------------------


def pack_ts(ts: int) -> bytes:
    """8 bytes that sort like the signed integer ``ts`` (clamped to 64 bits)."""
    return _U64.pack(min(max(ts, -_SIGN), _SIGN - 1) + _SIGN)


def unpack_ts(raw: bytes) -> int:
    return int(_U64.unpack(raw)[0]) - _SIGN


def program_prefix(program_id: str) -> bytes:
    return LISTING_PREFIX + program_id.encode() + SEPARATOR


def listing_key(program_id: str, created_at: int, account_id: str) -> bytes:
    return program_prefix(program_id) + pack_ts(created_at) + account_id.encode()


def index_key(program_id: str, account_id: str) -> bytes:
    return INDEX_PREFIX + program_id.encode() + SEPARATOR + account_id.encode()


def encode_listing(item: Listing) -> bytes:
    return codecs.dumps({"a": item.account_id, "s": item.status, "v": item.version, "c": item.created_at, "u": item.updated_at})


def decode_listing(program_id: str, raw: bytes) -> Listing:
    obj = codecs.loads_object(raw)
    return Listing(
        account_id=obj["a"], program_id=program_id, status=obj["s"], version=obj["v"], created_at=obj["c"], updated_at=obj["u"]
    )


def listing_cursor(item: Listing) -> str:
    """The position after ``item`` in a newest-first listing, as cursor text."""
    return f"{item.created_at}\x00{item.account_id}"


def listing_key_from_cursor(program_id: str, cursor: str) -> bytes:
    """Raises ``ValueError`` when ``cursor`` is not one :func:`listing_cursor` made."""
    created, sep, account_id = cursor.partition("\x00")
    if not sep or not account_id:
        raise ValueError("malformed listing cursor")
    return listing_key(program_id, int(created), account_id)


# -- batches (partitioned by batch_id) -------------------------------------------------------
#
# ``B`` + batch_id + NUL + ``m`` → the batch's manifest JSON ``{"ids": [command_id, ...]}``;
# ``B`` + batch_id + NUL + ``i`` + index (4 bytes, big-endian) → the item's outcome JSON
# (``outcome_records.batch_item_outcome``): the items of a batch sort by index after its manifest.

BATCH_PREFIX = b"B"


def batch_manifest_key(batch_id: str) -> bytes:
    return BATCH_PREFIX + batch_id.encode() + SEPARATOR + b"m"


def batch_item_prefix(batch_id: str) -> bytes:
    return BATCH_PREFIX + batch_id.encode() + SEPARATOR + b"i"


def batch_item_key(batch_id: str, index: int) -> bytes:
    return batch_item_prefix(batch_id) + index.to_bytes(4, "big")


def batch_item_index(key: bytes, prefix: bytes) -> int:
    return int.from_bytes(key[len(prefix) :], "big")
