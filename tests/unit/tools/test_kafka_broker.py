"""The local broker's helpers that need no broker."""

from __future__ import annotations

import base64

from tools.kafka_broker import new_cluster_id


def test_cluster_ids_are_16_random_bytes_and_never_look_like_an_option() -> None:
    ids = [new_cluster_id() for _ in range(5000)]  # about 1 in 64 base64 strings starts with "-"
    assert len(set(ids)) == len(ids)
    assert not any(cid.startswith("-") for cid in ids)
    assert all(len(base64.urlsafe_b64decode(cid + "==")) == 16 for cid in ids)
