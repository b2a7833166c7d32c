from __future__ import annotations

from services.tallies.state import MAX_CHANGES_PER_RECORD, PackedInputs, pack_by_partition
from shared.engine._partitioning import partition_for
from shared.projection import Change, Mark


def test_pack_groups_by_partition_and_program_keeps_order_and_takes_max_login() -> None:
    items: list[Change | Mark] = [
        Change("a", "P", "AccountCreated", 1),
        Mark("P", 50),
        Change("b", "Q", "AccountCreated", 1),
        Change("a", "P", "AccountDeactivated", 2),
        Mark("P", 20),
    ]
    packed = pack_by_partition(items, 8)
    by_program = {program: inputs for _, part in packed for program, inputs in part.programs.items()}
    assert [(c.entity, c.version) for c in by_program["P"].changes] == [("a", 1), ("a", 2)]
    assert by_program["P"].last_login == 50
    assert by_program["Q"].last_login is None and len(by_program["Q"].changes) == 1
    for partition, part in packed:
        assert {partition_for(program, 8) for program in part.programs} == {partition}


def test_pack_splits_large_partitions_and_roundtrips() -> None:
    items: list[Change | Mark] = [Change(f"a{i}", "P", "AccountCreated", 1) for i in range(MAX_CHANGES_PER_RECORD + 3)]
    parts = pack_by_partition(items, 8)
    assert [part.changes for _, part in parts] == [MAX_CHANGES_PER_RECORD, 3]
    decoded = PackedInputs.decode(parts[1][1].encode())
    assert decoded.programs["P"].changes == parts[1][1].programs["P"].changes
    assert decoded.changes == 3


def test_each_part_counts_the_input_records_it_stands_for() -> None:
    items: list[Change | Mark] = [
        *(Change(f"a{i}", "P", "AccountCreated", 1) for i in range(MAX_CHANGES_PER_RECORD + 1)),
        Mark("P", 5),
        Mark("P", 7),
    ]
    parts = pack_by_partition(items, 1)
    assert [part.records for _, part in parts] == [MAX_CHANGES_PER_RECORD, 3]
    assert sum(part.records for _, part in parts) == len(items)
    decoded = PackedInputs.decode(parts[1][1].encode())
    assert decoded.records == 3 and decoded.programs["P"].last_login == 7
