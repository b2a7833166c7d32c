"""The fleet on the secure broker: SASL_SSL (SCRAM-SHA-512, the broker's own CA) with ACLs,
each service connecting as its own user with only the ACLs tools/kafka_acls.py grants it.

- every service works: a command accepted by the validator becomes an event, the tallies
  count it, the retry scheduler redelivers a dead letter to the retry topic it names; and
  the orders domain and projection work too, granted the topics they name;
- a wrong password, or a user without the ACLs, stops the worker at start-up with a
  message that says what is wrong and what to change; so does a user that may see an input
  but not read it, at its first fetch.

The secure broker runs beside the plaintext one, on its own home and port
(``STATEFLEET_SECURE_BROKER_*``, see tools/kafka_broker.py); the test stops it if it started it.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from shared import dead_letters as dl
from tests.integration.retry_scheduler.helpers import letter_headers
from tests.integration.security.conftest import SecureBroker
from tests.support.environment import new_topic_prefix, service_environment, settings_env
from tests.support.kafka import Record, produce
from tests.support.services import ServiceProcess, free_port, wait_for
from tools import kafka_broker, web
from tools.kafka_acls import service_acls

#: How long a worker refused by the broker may take to exit (Python and Faust imports included).
REFUSED_EXIT_S = 60.0


def start_service(broker: SecureBroker, module: str, user: str, tmp: Path, **extra: str) -> ServiceProcess:
    # Fewer partitions: fewer changelog partitions to restore and transactional producers to start.
    settings = service_environment(
        broker.layout.bootstrap,
        broker.prefix,
        tmp / "data",
        guarantee="exactly_once",
        instance="a",
        standby_replicas=0,
        topic_partitions=2,
    )
    env = {**settings, **broker.env(user), **extra}
    return ServiceProcess(module, env, tmp / f"{module}-as-{user}.log", port=free_port()).start()


def counted_row(tallies: ServiceProcess, key: str, counter: str) -> dict[str, Any]:
    """The tallies' row of ``key`` (``GET /tallies/{key}``) once its ``counter`` is 1."""

    def row() -> dict[str, Any] | None:
        r = web.get(f"{tallies.url}/tallies/{key}", timeout=10)
        return r.json() if r.status_code == 200 and r.json()[counter] == 1 else None

    found: dict[str, Any] = wait_for(row, timeout=60, message=f"the row of {key} with {counter} 1")
    return found


def test_every_service_works_over_sasl_ssl_as_its_own_user(secure_broker: SecureBroker, tmp_path: Path) -> None:
    b = secure_broker
    procs = [
        start_service(b, "validator", "validator", tmp_path),
        start_service(b, "tallies", "tallies", tmp_path, STATEFLEET_TALLY_PUBLISH_INTERVAL_S="0.2"),
        start_service(
            b,
            "retry_scheduler",
            "retry_scheduler",
            tmp_path,
            STATEFLEET_RETRY_TICK_INTERVAL_S="0.2",
            STATEFLEET_RETRY_BASE_DELAY_MS="200",
            STATEFLEET_RETRY_JITTER="none",
        ),
    ]
    try:
        validator, tallies, scheduler = (p.wait_ready(120) for p in procs)

        account, program = f"acct-{uuid.uuid4().hex[:8]}", f"prog-{uuid.uuid4().hex[:8]}"
        command = {"command_id": f"{account}-1", "type": "CreateAccount", "account_id": account, "program_id": program}
        answer = web.post(validator.url + "/commands", json=command, params={"wait": "true"}, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "accepted"
        events = [orjson.loads(r.body) for r in b.read(b.topic("account-events"))]
        assert [(e["account_id"], e["type"], e["version"]) for e in events] == [(account, "AccountCreated", 1)]

        assert counted_row(tallies, program, "numberActive") == {
            "program_id": program,
            "numberActive": 1,
            "numberInactive": 0,
            "lastLogin": None,
        }

        # The dead letter names the validator's retry topic, which the scheduler may write by prefix.
        dlq_id = f"dl-{uuid.uuid4().hex[:8]}"
        retry_topic = b.topic("retry-validator")
        produce(b.topic("dead-letters"), [(b"k", b"not a command")], letter_headers(dlq_id, retry_topic), connection=b.admin)

        def redelivered() -> list[Record]:
            # The first redelivery (the validator may fail on it and dead-letter it again).
            return [
                r
                for r in b.read(retry_topic)
                if dict(r.headers).get(dl.ID) == dlq_id.encode() and dict(r.headers)[dl.ATTEMPT] == b"1"
            ]

        [record] = wait_for(redelivered, timeout=60, interval=0.5, message="the dead letter's redelivery")
        assert (record.key, record.value) == (b"k", b"not a command")
        for proc in (validator, tallies, scheduler):
            assert proc.proc is not None and proc.proc.poll() is None, proc.log_tail()
    finally:
        for proc in procs:
            proc.kill()


def test_a_domain_and_a_projection_of_their_own_work_as_their_users_with_their_grants(
    secure_broker: SecureBroker, tmp_path: Path
) -> None:
    """The orders example (examples/orders) under a prefix of its own, granted as
    ``kafka_broker grant --domain ... --projection ...`` grants it (tools/kafka_acls.py)."""
    b = secure_broker
    prefix, domain, projection = (new_topic_prefix("o"), "examples.orders.domain:ORDERS", "examples.orders.projection:PROJECTION")
    kafka_broker.grant(b.layout, prefix, jobs={}, projection=projection, domain=domain)
    orders = settings_env(topic_prefix=prefix)
    procs = [
        start_service(b, "validator", "validator", tmp_path, STATEFLEET_VALIDATOR_DOMAIN=domain, **orders),
        start_service(
            b,
            "tallies",
            "tallies",
            tmp_path,
            STATEFLEET_TALLIES_PROJECTION=projection,
            STATEFLEET_TALLY_PUBLISH_INTERVAL_S="0.2",
            **orders,
        ),
    ]
    try:
        validator, tallies = (p.wait_ready(120) for p in procs)
        order, customer = f"o-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:8]}"
        commands: list[dict[str, Any]] = [
            {"type": "PlaceOrder", "customer_id": customer, "data": {"amount_cents": 1250}},
            {"type": "PayOrder"},
            {"type": "ShipOrder"},
        ]
        for n, command in enumerate(commands):
            body = {"command_id": f"{order}-{n}", "order_id": order, **command}
            answer = web.post(validator.url + "/commands", json=body, params={"wait": "true"}, timeout=30)
            assert answer.status_code == 200 and answer.json()["status"] == "accepted", answer.text

        assert counted_row(tallies, customer, "shipped") == {
            "key": customer,
            "open": 0,
            "shipped": 1,
            "cancelled": 0,
            "revenue_cents": 1250,
        }
        for proc in (validator, tallies):
            assert proc.proc is not None and proc.proc.poll() is None, proc.log_tail()
    finally:
        for proc in procs:
            proc.kill()


def refused_start(broker: SecureBroker, module: str, user: str, tmp: Path, **extra: str) -> tuple[int, str]:
    """Start ``module`` as ``user`` and wait for it to exit: its exit code and log."""
    proc = start_service(broker, module, user, tmp, **extra)
    assert proc.proc is not None
    try:
        code = proc.proc.wait(REFUSED_EXIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{module} as {user} did not exit within {REFUSED_EXIT_S}s; log:\n{proc.log_tail()}")
    return code, proc.log_path.read_text(errors="replace")


def test_a_wrong_password_stops_the_worker_with_what_to_check(secure_broker: SecureBroker, tmp_path: Path) -> None:
    code, log = refused_start(secure_broker, "tallies", "tallies", tmp_path, STATEFLEET_KAFKA_SASL_PASSWORD="not-the-password")
    assert code != 0, log
    assert "error: tallies cannot start: SASL authentication failed for user 'tallies' (SCRAM-SHA-512)" in log, log
    assert "Check STATEFLEET_KAFKA_SASL_USERNAME and STATEFLEET_KAFKA_SASL_PASSWORD" in log, log


def test_a_user_without_the_acls_stops_the_worker_with_what_to_grant(secure_broker: SecureBroker, tmp_path: Path) -> None:
    # The validator's user runs the tallies: none of the tallies' own topics are its to see.
    code, log = refused_start(secure_broker, "tallies", "validator", tmp_path)
    assert code != 0, log
    changelog = secure_broker.topic("statefleet-tallies-memberships-changelog")
    assert "error: tallies cannot start: user 'validator' is not authorized to see or create topics " in log, log
    assert changelog in log and "grant User:validator DESCRIBE and CREATE" in log, log


def test_a_user_that_may_not_read_an_input_stops_the_worker_with_what_to_grant(
    secure_broker: SecureBroker, tmp_path: Path
) -> None:
    # It may see ``logins`` (the start-up checks pass), not read it: the first fetch says so.
    # Topics and a group of its own: the group of the tallies killed above waits out their session.
    b, user, prefix = secure_broker, "tallies_without_logins", new_topic_prefix()
    logins = f"{prefix}logins"
    acls = [a for a in service_acls("tallies", prefix, user=user) if (a.name, a.operation) != (logins, "READ")]
    kafka_broker.apply_security(b.layout, {user: "tallies-without-logins-pw"}, acls)
    code, log = refused_start(
        b,
        "tallies",
        "tallies",
        tmp_path,
        STATEFLEET_TOPIC_PREFIX=prefix,
        STATEFLEET_KAFKA_SASL_USERNAME=user,
        STATEFLEET_KAFKA_SASL_PASSWORD="tallies-without-logins-pw",
    )
    assert code != 0, log
    assert f"cannot go on: user '{user}' is not authorized to READ topic {logins}: grant User:{user} READ" in log, log
