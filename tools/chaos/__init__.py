"""``make chaos``: the whole fleet under faults, checked against a reference model."""
