"""The tallies' two hops: :mod:`.inputs` (validate and pack by program partition) and
:mod:`.by_program` (apply, count, publish)."""
