"""The route hop's one-pass encoding of a dead letter (``Routing.decide_letter``) gives the bytes
the entry path gives (``entry_from_letter``, ``decide_fate``, ``Decided.of``): whatever headers a
producer wrote, repeated, missing, out of range or foreign, and whether the letter is scheduled
or parked, and in the full form most producers write (read and stored without the general
path's merging). The inbox, the changelogs and every reader of a stored entry rely on one encoding."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.retry_scheduler.app import RetrySchedulerService
from services.retry_scheduler.entries import Decided, decode_entry, entry_from_letter
from services.retry_scheduler.handlers.routing import Routing
from shared import dead_letters as dl
from shared.settings import Settings
from tests.support.dead_letters import full_form_headers

NOW = 1_700_000_000_000

numbers = st.one_of(
    st.integers(-(2**70), 2**70).map(lambda n: str(n).encode()), st.sampled_from([b"", b"x", b" 7", b"\xff", b"1_000", b"-1"])
)
texts = st.one_of(st.text(max_size=12).map(str.encode), st.sampled_from([b"", b"dead-letters", b"bad topic!", b"\xff\xfe"]))
dlq_header = st.one_of(
    st.tuples(st.sampled_from([dl.ID, dl.ORIGINAL_TOPIC, dl.RETRY_TOPIC, dl.ERROR_CLASS, dl.ERROR_MESSAGE]), texts),
    st.tuples(
        st.sampled_from([dl.ORIGINAL_PARTITION, dl.ORIGINAL_OFFSET, dl.ATTEMPT, dl.FIRST_FAILED_AT, dl.FAILED_AT]), numbers
    ),
)
other_header = st.tuples(
    st.sampled_from(["traceparent", "x", "dlq.other", dl.SPRING_ORIGINAL_TOPIC, dl.CONNECT_TOPIC, dl.STREAMS_EXCEPTION]),
    st.binary(max_size=16),
)
headers = st.lists(st.one_of(dlq_header, other_header), max_size=14)


@pytest.fixture(scope="module")
def routing(tmp_path_factory: pytest.TempPathFactory) -> Routing:
    settings = Settings(data_dir=Path(tmp_path_factory.mktemp("route")), retry_max_attempts=4, retry_jitter="equal")
    return RetrySchedulerService(settings).routing


def entry_path(routing: Routing, letter: dl.DeadLetter, raw: list[tuple[str, bytes]]) -> Decided:
    return Decided.of(routing.decide_fate(entry_from_letter(letter, raw, NOW), NOW))


@settings(max_examples=400, deadline=None)
@given(
    raw=headers,
    key=st.one_of(st.none(), st.binary(max_size=8)),
    value=st.one_of(st.none(), st.binary(max_size=8)),
    timestamp=st.one_of(st.none(), st.integers(0, 2**42)),
)
def test_the_route_encodes_a_letter_as_its_entry_would(
    routing: Routing, raw: list[tuple[str, bytes]], key: bytes | None, value: bytes | None, timestamp: int | None
) -> None:
    letter = dl.parse_dead_letter(
        key, value, raw, topic="dead-letters", partition=2, offset=9, timestamp_ms=timestamp, default_retry_topic="retry"
    )
    assert routing.decide_letter(letter, raw, NOW) == entry_path(routing, letter, raw)


@settings(max_examples=300, deadline=None)
@given(case=full_form_headers(), value=st.one_of(st.none(), st.binary(max_size=8)))
def test_a_letter_in_the_full_form_encodes_as_its_entry_would(
    routing: Routing, case: tuple[list[tuple[str, bytes]], bool], value: bytes | None
) -> None:
    # Its headers are stored as they came, by place, unless a number was clamped.
    raw, in_full_form = case
    letter = dl.parse_dead_letter(
        None, value, raw, topic="dead-letters", partition=2, offset=9, timestamp_ms=NOW, default_retry_topic="retry"
    )
    assert letter.full_form == in_full_form
    assert routing.decide_letter(letter, raw, NOW) == entry_path(routing, letter, raw)


def test_both_fates_and_a_clamped_number_are_covered(routing: Routing) -> None:
    def letter(raw: list[tuple[str, bytes]], key: bytes | None = b"k") -> tuple[dl.DeadLetter, list[tuple[str, bytes]]]:
        return dl.parse_dead_letter(
            key, b"v", raw, topic="dead-letters", partition=0, offset=1, timestamp_ms=NOW, default_retry_topic="retry"
        ), raw

    scheduled = letter([(dl.ID, b"a"), (dl.ATTEMPT, b"2")])
    out_of_attempts = letter([(dl.ID, b"b"), (dl.ATTEMPT, b"4")])
    clamped = letter([(dl.ID, b"c"), (dl.ORIGINAL_OFFSET, b"99999999999999999999"), (dl.ID, b"again")])
    for parsed, raw in (scheduled, out_of_attempts, clamped):
        decided = routing.decide_letter(parsed, raw, NOW)
        assert decided == entry_path(routing, parsed, raw)
    assert not routing.decide_letter(*scheduled, NOW).parked
    parked = routing.decide_letter(*out_of_attempts, NOW)
    assert parked.parked and decode_entry(parked.stored).parked_at == NOW
    stored = decode_entry(routing.decide_letter(*clamped, NOW).stored)
    assert stored.origin_offset == 2**63 - 1  # kept clamped; the header goes out as it came
    assert (dl.ORIGINAL_OFFSET, b"99999999999999999999") in stored.headers
