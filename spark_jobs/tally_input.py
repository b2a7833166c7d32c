"""Reading tally inputs exactly as the tallies service does.

The service (``services.tallies.app.parse_input``) decodes a record's value with
``shared.codecs.loads_object`` and reads it with ``parse_account_change`` (every reader's
``shared.accounts.parse_event``) or ``parse_login`` from ``services.tallies.domain``.
Records it rejects go to dead letters and never count; the backfill skips the same
records and reports them. This module runs on Spark's Python workers, so it imports only
pure modules (no Faust).
"""

from __future__ import annotations

from services.tallies.domain import InvalidInput, Login, parse_account_change, parse_login
from shared import codecs
from shared.accounts import AccountChange

CHANGE = "change"
LOGIN = "login"


def parse_input(kind: str, value: bytes | None) -> AccountChange | Login:
    """An AccountChange (``kind`` ``"change"``, from account-events) or Login (``"login"``, from logins).

    Raises ``codecs.DecodeError`` or ``InvalidInput`` for a record the service would reject.
    """
    obj = codecs.loads_object(value)
    if kind == LOGIN:
        item: AccountChange | Login = parse_login(obj)
    elif kind == CHANGE:
        item = parse_account_change(obj)
    else:
        raise InvalidInput(f"unknown input kind {kind!r}")
    return item
