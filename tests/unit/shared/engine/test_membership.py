"""The peer watch's judgement, without a broker: what a probe says of a peer, when a peer is
gone, who removes it and when, what a restart announcement spares, and how a member's URL is
read from its group metadata."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from faust.assignor.client_assignment import ClientAssignment, ClientMetadata

from shared.engine._membership import Gone, PeerVerdicts, Probe, ask_healthz, classify, member_url

A, B, C = "http://a:1", "http://b:1", "http://c:1"


def verdicts(own: str = A, peers: tuple[str, ...] = (B, C), refused_gone_after_s: float | None = None) -> PeerVerdicts:
    """Verdicts of ``own`` on ``peers``, each seen up once at time 0."""
    v = PeerVerdicts(own_url=own, gone_after_s=1.0, restart_grace_s=45.0, refused_gone_after_s=refused_gone_after_s)
    v.set_peers([*peers, own])
    for url in peers:
        v.record(url, Probe.UP, 0.0)
    return v


def fail(v: PeerVerdicts, url: str, times: list[float]) -> None:
    for t in times:
        v.record(url, Probe.UNREACHABLE, t)


def test_a_peer_is_gone_only_after_three_failed_probes_spanning_the_gone_time() -> None:
    v = verdicts()
    assert v.peers == [B, C]  # never itself
    fail(v, B, [0.0, 0.25, 0.5])
    assert v.gone(0.9) == []  # three failures, but within 1 s
    fail(v, B, [0.75, 1.0])
    assert v.gone(1.0) == [Gone(B, 5, 0.0)]

    w = verdicts()
    fail(w, B, [0.0, 5.0])  # long apart, but only two
    assert w.gone(5.0) == []


@pytest.mark.parametrize("answer", [Probe.UP, Probe.SLOW])
def test_an_answer_or_a_slow_connection_ends_the_streak(answer: Probe) -> None:
    v = verdicts()
    fail(v, B, [0.0, 0.25, 0.5, 0.75])
    v.record(B, answer, 0.9)
    fail(v, B, [1.0, 1.25])
    assert v.gone(1.5) == []  # the new streak began at 1.0
    fail(v, B, [1.5, 2.0])
    assert v.gone(2.0) == [Gone(B, 4, 1.0)]


def test_a_late_probe_counts_for_nothing() -> None:
    v = verdicts()
    fail(v, B, [0.0, 0.25])
    v.record(B, Probe.LATE, 0.5)
    assert v.gone(2.0) == []
    fail(v, B, [2.0])
    assert [g.url for g in v.gone(2.0)] == [B]


def test_the_lowest_live_url_acts_at_once_the_others_later_as_backups() -> None:
    # C is gone; A and B both see it. A (lowest URL) acts at once, B one gone-time later.
    a, b = verdicts(A, (B, C)), verdicts(B, (A, C))
    for v in (a, b):
        fail(v, C, [0.0, 0.5, 1.0])
    gone_a, gone_b = a.gone(1.0)[0], b.gone(1.0)[0]
    assert a.due(gone_a, 1.0)
    assert not b.due(gone_b, 1.0) and not b.due(gone_b, 1.9) and b.due(gone_b, 2.0)


def test_a_survivor_that_sees_the_lower_urls_failing_acts_at_once() -> None:
    # From C's view both A and B are gone: C is the lowest live one.
    c = verdicts(C, (A, B))
    fail(c, A, [0.0, 0.5, 1.0])
    fail(c, B, [0.0, 0.5, 1.0])
    assert [g.url for g in c.gone(1.0)] == [A, B]
    assert all(c.due(g, 1.0) for g in c.gone(1.0))


def test_a_peer_never_seen_listening_is_not_judged() -> None:
    # A joining instance is in the assignment before its API listens.
    v = PeerVerdicts(own_url=A, gone_after_s=1.0, restart_grace_s=45.0)
    v.set_peers([B])
    fail(v, B, [0.0, 0.5, 1.0, 5.0])
    assert v.gone(5.0) == []
    v.record(B, Probe.SLOW, 5.5)  # connected: it listens, even if it did not answer in time
    fail(v, B, [6.0, 6.5, 7.0])
    assert [g.url for g in v.gone(7.0)] == [B]


def test_a_removed_peer_needs_new_evidence_once_seen_up_again() -> None:
    v = verdicts()
    fail(v, B, [0.5, 1.0, 1.5])
    v.removed(B)
    assert v.gone(1.5) == []
    fail(v, B, [2.0, 2.5, 3.0, 3.5])
    assert v.gone(3.5) == []  # not seen up since
    v.record(B, Probe.UP, 4.0)
    fail(v, B, [4.5, 5.0, 5.5])
    assert [g.url for g in v.gone(5.5)] == [B]


def test_an_announced_restart_is_spared_for_the_grace_time_then_judged_again() -> None:
    v = verdicts()
    v.announce_restart(B + "/", 0.0)
    fail(v, B, [0.5, 1.0, 1.5, 2.0, 10.0])
    assert v.gone(10.0) == []
    assert v.gone(44.9) == []
    fail(v, B, [45.0])
    assert [g.url for g in v.gone(45.0)] == [B]  # not back within the session timeout


def test_a_restart_announcement_is_spent_once_the_peer_is_back() -> None:
    v = verdicts()
    v.announce_restart(B, 0.0)
    v.record(B, Probe.UP, 0.1)  # still up while it stops: the announcement holds
    fail(v, B, [0.5, 1.0, 1.5])
    assert v.gone(2.0) == []
    v.record(B, Probe.UP, 5.0)  # back
    fail(v, B, [6.0, 6.5, 7.0])  # then killed: judged like any other peer
    assert [g.url for g in v.gone(7.0)] == [B]


def test_a_restarting_peer_is_not_counted_alive_when_ranking() -> None:
    b = verdicts(B, (A, C))
    b.announce_restart(A, 0.0)
    fail(b, A, [0.0, 0.5, 1.0])
    fail(b, C, [0.0, 0.5, 1.0])
    assert [g.url for g in b.gone(1.0)] == [C]
    assert b.due(b.gone(1.0)[0], 1.0)  # A is away, so B is the lowest live URL


def test_peers_no_longer_assigned_are_forgotten() -> None:
    v = verdicts()
    fail(v, B, [0.0, 0.5, 1.0])
    v.set_peers([C])
    assert v.peers == [C] and v.gone(2.0) == []
    v.record(B, Probe.UNREACHABLE, 2.0)  # a probe answered after the peer left: ignored
    assert v.peers == [C]


def test_a_peer_whose_port_refuses_every_probe_is_gone_sooner() -> None:
    v = verdicts(A, (B, C), refused_gone_after_s=0.5)
    for t in (0.0, 0.25, 0.5):
        v.record(B, Probe.REFUSED, t)  # nothing listens: the process is gone
        v.record(C, Probe.REFUSED if t < 0.5 else Probe.UNREACHABLE, t)  # one timeout: the network, maybe
    gone = v.gone(0.5)
    assert [g.url for g in gone] == [B] and gone[0].after_s == 0.5
    assert v.due(gone[0], 0.5)
    fail(v, C, [0.75, 1.0])
    assert [g.url for g in v.gone(1.0)] == [B, C]
    # Two refusals are not enough, however long apart.
    w = verdicts(A, (B,), refused_gone_after_s=0.5)
    w.record(B, Probe.REFUSED, 0.0)
    w.record(B, Probe.REFUSED, 5.0)
    assert w.gone(5.0) == []


def test_a_backup_acts_a_gone_time_after_the_first_when_the_port_refuses() -> None:
    b = verdicts(B, (A, C), refused_gone_after_s=0.5)
    for t in (0.0, 0.25, 0.5):
        b.record(C, Probe.REFUSED, t)
    gone = b.gone(0.5)[0]
    assert not b.due(gone, 0.5) and not b.due(gone, 1.4) and b.due(gone, 1.5)  # A, alive, acts first


def test_a_probe_far_later_than_its_timeout_says_nothing_about_the_peer() -> None:
    # Took far longer than its timeout: this instance's loop was late, the peer tells nothing.
    assert classify(Probe.UNREACHABLE, 3.0, 0.5) is Probe.LATE
    assert classify(Probe.UP, 3.0, 0.5) is Probe.LATE
    assert classify(Probe.UP, 0.01, 0.5) is Probe.UP
    assert classify(Probe.SLOW, 0.5, 0.5) is Probe.SLOW


def test_a_members_url_is_read_from_faust_metadata() -> None:
    client = ClientMetadata(
        assignment=ClientAssignment(actives={}, standbys={}), url="http://10.0.0.7:8002/", changelog_distribution={}
    )
    metadata = ConsumerProtocolMemberMetadata(4, ["account-events", "logins"], client.dumps()).encode()
    assert member_url(metadata) == "http://10.0.0.7:8002"
    assert member_url(ConsumerProtocolMemberMetadata(0, ["t"], b"not json").encode()) is None
    assert member_url(ConsumerProtocolMemberMetadata(0, ["t"], b'{"no": "url"}').encode()) is None
    assert member_url(b"\x00") is None


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again at once: nothing listens there


async def serve(answer: bytes | None) -> tuple[asyncio.Server, int]:
    """A server on a free port that answers every connection with ``answer`` (None: it reads
    and never answers; b"": it hangs up at once)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if answer is None:
            await asyncio.sleep(5)
        elif answer:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_closed_port_on_this_host_is_refused() -> None:
    assert await ask_healthz(f"http://127.0.0.1:{closed_port()}", 0.5) is Probe.REFUSED


async def test_a_peer_that_answers_is_up_whatever_it_answers() -> None:
    for answer in (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b"HTTP/1.1 503 x\r\n\r\n", b"garbled\n"):
        server, port = await serve(answer)
        async with server:
            assert await ask_healthz(f"http://127.0.0.1:{port}", 0.5) is Probe.UP, answer


async def test_a_peer_that_takes_the_connection_and_does_not_answer_is_slow() -> None:
    server, port = await serve(None)
    async with server:
        assert await ask_healthz(f"http://127.0.0.1:{port}", 0.2) is Probe.SLOW


async def test_a_peer_that_hangs_up_without_an_answer_is_unreachable() -> None:
    server, port = await serve(b"")
    async with server:
        assert await ask_healthz(f"http://127.0.0.1:{port}", 0.5) is Probe.UNREACHABLE


async def test_a_host_that_cannot_be_found_is_unreachable() -> None:
    assert await ask_healthz("http://no-such-host.invalid:8002", 0.5) is Probe.UNREACHABLE
