"""What a worker the brokers refuse says (shared/engine/_access.py), without a broker."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

import pytest
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

from shared.engine._access import BrokerAccessDenied, check_created, check_visible, explain_denial, refusal
from shared.engine._clients import client_kwargs
from shared.settings import Settings

SASL = Settings(kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_username="tallies", kafka_sasl_password="pw")


def test_a_refused_read_or_write_says_which_acl_to_grant_to_whom() -> None:
    read = explain_denial(TopicAuthorizationFailedError("p.logins"), "tallies", "p.statefleet-tallies", reading=True)
    assert read == (
        "user 'tallies' is not authorized to READ topic p.logins: grant User:tallies READ on topic p.logins "
        "(docs/security.md lists each service's ACLs)"
    )
    write = explain_denial(TopicAuthorizationFailedError({"b", "a"}), "tallies", "app", reading=False)
    assert write is not None and "to WRITE topic a, b: grant User:tallies WRITE on topic a, b" in write
    group = explain_denial(GroupAuthorizationFailedError(), "tallies", "app", reading=True)
    assert group is not None and "grant User:tallies READ and DESCRIBE on group app" in group
    txn = explain_denial(TransactionalIdAuthorizationFailed(), "tallies", "app", reading=False)
    assert txn is not None and "WRITE and DESCRIBE on transactional ids with the prefix app." in txn
    cluster = explain_denial(ClusterAuthorizationFailedError(), None, "app", reading=False)
    assert cluster is not None and "grant this client's principal IDEMPOTENT_WRITE on the cluster" in cluster
    assert explain_denial(KafkaConnectionError(), "tallies", "app", reading=True) is None


def test_an_exception_is_explained_once_and_carries_the_explanation() -> None:
    exc = TopicAuthorizationFailedError("p.program-tallies")
    first = explain_denial(exc, "tallies", "app", reading=False)
    assert first is not None
    # The failed batch goes on up the fetch loop, which must not call the write a read.
    assert explain_denial(exc, "tallies", "app", reading=True) is None
    assert exc.__notes__ == [f"what to grant: {first}"]


def test_topics_refused_at_creation_are_named_and_existing_ones_returned() -> None:
    response = SimpleNamespace(topic_errors=[("a", 0, None), ("b", 36, "exists"), ("c", 29, None), ("d", 29, None)])
    with pytest.raises(BrokerAccessDenied, match=r"user 'tallies' is not authorized to see or create topics c, d: grant"):
        check_created(SASL, response)
    assert check_created(SASL, SimpleNamespace(topic_errors=[("a", 0, None), ("b", 36, "exists")])) == ["b"]


def test_an_existing_topic_is_hidden_only_when_its_metadata_is_refused() -> None:
    check_visible(SASL, [{"topic": "just-created", "error_code": 3}, {"topic": "seen", "error_code": 0}])
    with pytest.raises(BrokerAccessDenied, match="not authorized to describe topic hidden: grant User:tallies"):
        check_visible(SASL, [{"topic": "hidden", "error_code": 29}])


def test_no_broker_listening_is_a_reason_to_wait_not_a_refusal() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = SASL.model_copy(update={"kafka_bootstrap_servers": f"127.0.0.1:{port}"})
    assert asyncio.run(refusal(settings, client_kwargs(settings))) is None
