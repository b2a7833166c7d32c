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


def test_each_part_counts_the_input_records_it_stands_for() -> None:
    items: list[AccountChange | Login] = [
        *(AccountChange(f"a{i}", "P", "AccountCreated", 1) for i in range(MAX_CHANGES_PER_RECORD + 1)),
        Login("a", "P", 5), Login("b", "P", 7), Login("c", "Q", 1),
    ]
    parts = pack_by_program(items)
    assert [(p, part.records) for p, part in parts] == [("P", MAX_CHANGES_PER_RECORD), ("P", 3), ("Q", 1)]
    assert sum(part.records for _, part in parts) == len(items)
    assert ProgramInputs.decode("P", parts[1][1].encode()).records == 3


def test_a_record_without_a_count_counts_its_changes_and_login() -> None:
    raw = b'{"c": [["a", "AccountCreated", 1], ["b", "AccountCreated", 1]], "l": 9}'
    assert ProgramInputs.decode("P", raw).records == 3
