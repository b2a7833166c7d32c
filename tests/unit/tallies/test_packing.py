from __future__ import annotations

from services.tallies.app import MAX_CHANGES_PER_RECORD, ProgramInputs, pack_by_program
from services.tallies.domain import AccountChange, Login


def test_pack_groups_by_program_keeps_order_and_takes_max_login() -> None:
    items: list[AccountChange | Login] = [
        AccountChange("a", "P", "AccountCreated", 1),
        Login("a", "P", 50),
        AccountChange("b", "Q", "AccountCreated", 1),
        AccountChange("a", "P", "AccountDeactivated", 2),
        Login("b", "P", 20),
    ]
    packed = dict(pack_by_program(items))
    assert [(c.account_id, c.version) for c in packed["P"].changes] == [("a", 1), ("a", 2)]
    assert packed["P"].last_login == 50
    assert packed["Q"].last_login is None and len(packed["Q"]) == 1


def test_pack_splits_large_programs_and_roundtrips() -> None:
    items: list[AccountChange | Login] = [
        AccountChange(f"a{i}", "P", "AccountCreated", 1) for i in range(MAX_CHANGES_PER_RECORD + 3)
    ]
    parts = pack_by_program(items)
    assert [len(p.changes) for _, p in parts] == [MAX_CHANGES_PER_RECORD, 3]
    decoded = ProgramInputs.decode("P", parts[1][1].encode())
    assert decoded.changes == parts[1][1].changes
