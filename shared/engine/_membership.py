"""The peer watch: a dead instance's partitions move within seconds, not after the session timeout.

With static membership (``group.instance.id``) the group coordinator keeps a silent
member, and the partitions assigned to it, until its session times out (45 s by
default): a SIGKILLed instance's partitions are processed by nobody for that long. The
session timeout cannot simply be lowered, since a busy but healthy instance would then
be expelled. Instead every instance watches its peers over HTTP, where "dead" can be
told from "busy":

* **Probes.** Every ``peer_probe_interval_s`` each peer's ``GET /healthz`` is asked on a
  fresh TCP connection. Any HTTP answer means the process is there. A connection that is
  made but not answered in time is *slow*, not dead: the kernel completes the handshake
  for a listening socket even while the process's event loop is blocked by a long batch
  or the process is stopped (SIGSTOP), so slowness is never evidence of death (the
  broker's session timeout remains the judge of a hung process). A refused connection
  (the port is closed: the process is gone) or a connect timeout (on Kubernetes a dead
  pod's address stops answering at all) is evidence; a peer is *gone* after at least
  :data:`MIN_FAILED_PROBES` such probes in a row spanning ``peer_gone_after_s``, or
  ``peer_refused_gone_after_s`` when every one of them was refused: a refusal comes from a
  host that is there and has nothing listening on the port (the process is gone), while a
  timeout may be a network that is slow for a moment. Only a
  peer seen listening before is judged: a joining instance is in the assignment before its
  API listens (the worker starts it once recovered), and one that dies before it ever
  listens is left to the session timeout.
* **Removal.** For a gone peer, the group is described on its coordinator
  (DescribeGroups); each member's metadata is Faust's, which holds the member's URL
  (:func:`member_url`). The member with the gone URL is removed by LeaveGroup v1 with its
  member id and no instance id, which the broker accepts for a static member; the group
  rebalances at once, and each survivor that sees the member gone from the group rejoins
  right away instead of waiting for its next heartbeat to hear of the rebalance.
* **Who acts.** Each survivor judges on its own probes. The survivor with the lowest URL
  among those it sees alive (itself included) acts as soon as the peer is gone; the
  others act only ``peer_gone_after_s`` later per place in that order, as a backup for a
  survivor that cannot act. A second LeaveGroup for a member already removed is answered
  UNKNOWN_MEMBER_ID and changes nothing, so a duplicate from a backup is harmless.
* **Restarts.** A worker stopping on SIGTERM tells its peers it is restarting
  (``POST /instance/restarting``, see :func:`announce_restart`); they then leave its
  member alone for the restart grace (``restart_grace_s``, at most the session timeout),
  so a quick restart with static membership gets its partitions back without a
  rebalance. One that is still gone after the grace (scaled in, or slow to come back) is
  removed like a dead one, so its partitions move to their standbys instead of waiting for
  the session timeout; unless the group already holds a new member for its URL (a static
  member rejoining gets a new member id), which is the instance back and still recovering,
  its API not listening yet. The member ids an instance had when it announced its restart
  are what tells the two apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import faust
import httpx
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from aiokafka.protocol.group import LeaveGroupRequest

from shared.engine._admin import _Admin
from shared.engine._assignor import member_urls
from shared.engine._clients import client_kwargs, started_when_reachable
from shared.engine._context import context_of
from shared.engine._faust import request_rejoin
from shared.engine._loops import run_every
from shared.metrics import PEER_FAILOVERS, PEER_RESTARTS_ANNOUNCED
from shared.settings import Settings

log = logging.getLogger(__name__)

#: Failed probes in a row, at the least, before a peer counts as gone (besides the time they span).
MIN_FAILED_PROBES = 3
#: A probe that took this much longer than its timeout measured this instance's own event loop
#: (blocked, or the process stopped), not the peer: its outcome is not counted.
LATE_PROBE_SLACK_S = 0.5
#: The path peers announce a restart to (served by shared.http.instance).
RESTARTING_PATH = "/instance/restarting"
#: Longest a stopping worker waits for its peers to take its restart announcement.
ANNOUNCE_TIMEOUT_S = 1.0
#: Longest wait for one request to the group coordinator.
COORDINATOR_TIMEOUT_S = 5.0
#: Kafka's error code for a member id the coordinator does not know (already removed).
UNKNOWN_MEMBER_ID = 25
#: A survivor asks its own consumer to rejoin for one gone peer at most this often.
REJOIN_EVERY_S = 5.0


class Probe(enum.Enum):
    UP = "up"  # answered over HTTP, whatever the status: the process is there
    SLOW = "slow"  # connected but no answer in time: busy or stopped, not dead
    REFUSED = "refused"  # nothing listens on the port: the strongest evidence of death
    UNREACHABLE = "unreachable"  # connect timed out, or reset: evidence of death
    LATE = "late"  # this instance was late itself: says nothing about the peer


async def ask_healthz(url: str, timeout_s: float) -> Probe:
    """One probe of the peer at ``url``: ``GET /healthz`` on a fresh connection, each of the
    connect and the first line of the answer given ``timeout_s``.

    Plain asyncio rather than an HTTP client: the probe needs only whether and how the
    connection was made and whether any answer came, and at 4 probes a second per peer an
    HTTP client's request machinery was most of what an idle instance spent.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "localhost", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=parts.scheme == "https" or None), timeout_s
        )
    except ConnectionRefusedError:
        return Probe.REFUSED
    except (TimeoutError, OSError):  # no answer to the connect, no route, no such host, reset
        return Probe.UNREACHABLE
    try:
        writer.write(f"GET /healthz HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
        status_line = await asyncio.wait_for(reader.readline(), timeout_s)
    except TimeoutError:  # connected but not answered: busy or stopped, not dead
        return Probe.SLOW
    except OSError:  # reset mid-request: the next probe tells more
        return Probe.UNREACHABLE
    finally:
        writer.close()
    # Closed without a word is no answer; any other bytes are one, even if not HTTP's.
    return Probe.UP if status_line else Probe.UNREACHABLE


def classify(outcome: Probe, elapsed_s: float, timeout_s: float) -> Probe:
    """What one probe says about the peer, given how long it took: one far later than its
    timeout allows measured this instance's own event loop, not the peer."""
    return Probe.LATE if elapsed_s > timeout_s + LATE_PROBE_SLACK_S else outcome


def member_url(metadata: bytes) -> str | None:
    """The URL in a group member's metadata (Faust's assignor puts its ClientMetadata, as JSON,
    in the consumer protocol's user data); None for metadata that is not Faust's."""
    try:
        user_data = ConsumerProtocolMemberMetadata.decode(metadata).user_data
        url = json.loads(user_data).get("url")
    except Exception:
        return None
    return str(url).rstrip("/") if isinstance(url, str) and url else None


@dataclass(frozen=True)
class Gone:
    url: str
    failures: int
    since: float  # when the first of the failed probes in a row started
    #: How long its probes had to fail for it to count as gone (shorter when all were refused).
    after_s: float = field(default=0.0, compare=False)


@dataclass
class _Peer:
    failures: int = 0
    first_failure: float | None = None
    refused_only: bool = True  # every failure of the streak a refused connection
    # A joining instance is in the assignment before its API listens (the worker starts it once
    # recovered), so a peer is judged only once it has been seen listening.
    seen_up: bool = False


@dataclass
class _Announcement:
    until: float
    seen_down: bool = False  # once down and then up again, it is back and the announcement is spent


@dataclass
class PeerVerdicts:
    """What the probes say of each peer, and when this instance acts on a gone one (no I/O, no clock)."""

    own_url: str
    gone_after_s: float
    restart_grace_s: float
    #: How long refused connections alone take to count (at most ``gone_after_s``).
    refused_gone_after_s: float | None = None
    min_failures: int = MIN_FAILED_PROBES
    _peers: dict[str, _Peer] = field(default_factory=dict)
    _restarting: dict[str, _Announcement] = field(default_factory=dict)

    def set_peers(self, urls: Iterable[str]) -> None:
        """The peers to watch now (the last assignment's); others are forgotten."""
        urls = {u.rstrip("/") for u in urls} - {self.own_url}
        self._peers = {u: self._peers.get(u) or _Peer() for u in urls}

    @property
    def peers(self) -> list[str]:
        return sorted(self._peers)

    def record(self, url: str, probe: Probe, now: float) -> None:
        peer = self._peers.get(url)
        if peer is None or probe is Probe.LATE:
            return
        announced = self._restarting.get(url)
        if probe in (Probe.UNREACHABLE, Probe.REFUSED):
            if peer.failures == 0:
                peer.first_failure, peer.refused_only = now, True
            peer.failures += 1
            peer.refused_only = peer.refused_only and probe is Probe.REFUSED
            if announced is not None:
                announced.seen_down = True
            return
        peer.failures, peer.first_failure, peer.seen_up = 0, None, True
        if probe is Probe.UP and announced is not None and announced.seen_down:
            del self._restarting[url]  # back from its restart

    def announce_restart(self, url: str, now: float) -> None:
        self._restarting[url.rstrip("/")] = _Announcement(until=now + self.restart_grace_s)

    def restarting(self, url: str, now: float) -> bool:
        announced = self._restarting.get(url)
        if announced is not None and now >= announced.until:
            del self._restarting[url]
            return False
        return announced is not None

    def gone(self, now: float) -> list[Gone]:
        """Peers whose probes failed long and often enough, and that did not announce a restart."""
        out = []
        for url, peer in sorted(self._peers.items()):
            after_s = self._gone_after(peer)
            if (
                peer.seen_up
                and peer.first_failure is not None
                and peer.failures >= self.min_failures
                and now - peer.first_failure >= after_s
                and not self.restarting(url, now)
            ):
                out.append(Gone(url, peer.failures, peer.first_failure, after_s))
        return out

    def _gone_after(self, peer: _Peer) -> float:
        if peer.refused_only and self.refused_gone_after_s is not None:
            return min(self.refused_gone_after_s, self.gone_after_s)
        return self.gone_after_s

    def rank(self, now: float) -> int:
        """This instance's place among the instances it sees alive, by URL (0: it acts first)."""
        alive = {u for u, p in self._peers.items() if p.failures == 0 and not self.restarting(u, now)}
        return sorted(alive | {self.own_url}).index(self.own_url)

    def due(self, gone: Gone, now: float) -> bool:
        """Whether this instance removes ``gone``'s member now: at once when it ranks first,
        else ``gone_after_s`` later per place, as a backup."""
        return now >= gone.since + (gone.after_s or self.gone_after_s) + self.gone_after_s * self.rank(now)

    def removed(self, url: str) -> None:
        """Its member was removed: a new case needs new evidence, once it is seen up again."""
        if url in self._peers:
            self._peers[url] = _Peer()


def _watch(app: faust.App) -> PeerWatch | None:
    context = context_of(app)
    return context.peer_watch if context is not None else None


def note_peer_restarting(app: faust.App, url: str) -> bool:
    """A peer says it is restarting: leave its member alone for a session timeout. False when
    this instance keeps no peer watch."""
    watch = _watch(app)
    if watch is None:
        return False
    watch.verdicts.announce_restart(url, time.monotonic())
    watch.remember_members(url.rstrip("/"))
    PEER_RESTARTS_ANNOUNCED.labels(watch.service).inc()
    log.info(
        "peer %s says it is restarting: not removing it for %.0fs unless it is back",
        url.rstrip("/"),
        watch.settings.effective_restart_grace_s,
    )
    return True


async def announce_restart(app: faust.App) -> None:
    """Tell every peer this instance is restarting (a worker stopping on a signal), and stop
    acting on peers; each peer is given :data:`ANNOUNCE_TIMEOUT_S` at most."""
    watch = _watch(app)
    if watch is not None:
        await watch.announce_restart()


class PeerWatch:
    """Probes the peers and removes a gone one's group member (see the module docs)."""

    def __init__(self, app: faust.App, service: str, group_id: str, own_url: str, settings: Settings) -> None:
        self.app = app
        self.service = service
        self.group_id = group_id
        self.settings = settings
        self.interval_s = settings.peer_probe_interval_s
        # Connect timeouts count as evidence, so several must fit in the time a peer needs to be gone.
        self.probe_timeout_s = min(0.5, settings.peer_gone_after_s / 2)
        self.verdicts = PeerVerdicts(
            own_url.rstrip("/"),
            settings.peer_gone_after_s,
            settings.effective_restart_grace_s,
            refused_gone_after_s=settings.peer_refused_gone_after_s,
        )
        self.stopping = False
        self._admin: _Admin | None = None
        self._rejoined: dict[str, float] = {}
        #: URL -> the member ids its group member had when it announced a restart.
        self._members_at_restart: dict[str, set[str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        context = context_of(app)
        if context is not None:
            context.peer_watch = self

    # -- the loop ----------------------------------------------------------------------

    async def run(self) -> None:
        """Probe every interval until the worker stops (an Engine app task)."""
        try:
            self._admin = await started_when_reachable(lambda: _Admin(**client_kwargs(self.settings)), "peer watch")
            # The broker or a peer misbehaving fails one tick; the next tries again.
            await run_every(self.interval_s, self.tick, lambda: not self.stopping, lambda exc: log.warning("peer watch: %r", exc))
        finally:
            await self.close()

    async def close(self) -> None:
        self.stopping = True
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()

    async def tick(self) -> None:
        verdicts = self.verdicts
        verdicts.set_peers(member_urls(self.app))
        peers = verdicts.peers
        if not peers:
            return
        outcomes = await asyncio.gather(*(self.probe(url) for url in peers))
        now = time.monotonic()
        for url, outcome in zip(peers, outcomes, strict=True):
            verdicts.record(url, outcome, now)
        for gone in verdicts.gone(now):
            if self.stopping:
                return
            await self.fail_over(gone, act=verdicts.due(gone, now))

    async def probe(self, url: str) -> Probe:
        started = time.monotonic()
        outcome = await ask_healthz(url, self.probe_timeout_s)
        return classify(outcome, time.monotonic() - started, self.probe_timeout_s)

    # -- the group ---------------------------------------------------------------------

    async def fail_over(self, gone: Gone, *, act: bool) -> None:
        """Remove ``gone``'s member if it is still in the group and this instance acts now; rejoin
        once it is out of the group (removed by anyone) while this instance's assignment still
        names it."""
        coordinator, members = await self.describe_group()
        ids = [member_id for member_id, url in members if url == gone.url]
        before = self._members_at_restart.get(gone.url)
        if ids and before is not None and not set(ids) <= before:
            # It announced a restart, and the group holds a member for its URL that it did not
            # have then: the instance is back (a static member rejoins under a new member id)
            # and recovering, its API not listening yet. Judged again once it answers.
            del self._members_at_restart[gone.url]
            self.verdicts.removed(gone.url)
            log.info(
                "peer %s is back in group %s after its restart (member %s): not removing it",
                gone.url,
                self.group_id,
                ", ".join(sorted(set(ids) - before)),
            )
            return
        if ids and act:
            # A last look: a peer that answers now (restarted quickly) is not removed.
            if await self.probe(gone.url) not in (Probe.UNREACHABLE, Probe.REFUSED):
                return
            for member_id in ids:
                await self.leave_group(coordinator, member_id)
                PEER_FAILOVERS.labels(self.service).inc()
                log.warning(
                    "peer %s gone after %d failed probes over %.1fs; removed its member %s from group %s",
                    gone.url,
                    gone.failures,
                    time.monotonic() - gone.since,
                    member_id,
                    self.group_id,
                )
            self.verdicts.removed(gone.url)
            self._members_at_restart.pop(gone.url, None)
            ids = []
        if not ids:
            self.rejoin(gone.url)

    def rejoin(self, url: str) -> None:
        now = time.monotonic()
        if url not in member_urls(self.app) or now - self._rejoined.get(url, -REJOIN_EVERY_S) < REJOIN_EVERY_S:
            return  # the group already rebalanced without it, or the rejoin was asked for already
        self._rejoined[url] = now
        # The coordinator tells the survivors of the rebalance only on their next heartbeat (up to
        # 0.5 s away); rejoining at once saves that wait.
        if request_rejoin(self.app):
            log.info("peer %s is out of group %s: rejoining now", url, self.group_id)

    def remember_members(self, url: str) -> None:
        """Note, in the background, the member ids ``url`` has in the group now (it announced a
        restart): a different one later is the instance back."""

        async def remember() -> None:
            try:
                _, members = await self.describe_group()
            except Exception as exc:  # the broker away: then the grace alone decides
                log.info("could not note the group member of restarting peer %s: %r", url, exc)
                return
            self._members_at_restart[url] = {member_id for member_id, u in members if u == url}

        if self._admin is None:
            return
        task = asyncio.get_running_loop().create_task(remember())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def describe_group(self) -> tuple[int, list[tuple[str, str | None]]]:
        """The group's coordinator and its members as (member id, URL from the metadata)."""
        admin = self._admin
        assert admin is not None
        coordinator = await asyncio.wait_for(admin.find_coordinator(self.group_id), COORDINATOR_TIMEOUT_S)
        responses = await asyncio.wait_for(
            admin.describe_consumer_groups([self.group_id], group_coordinator_id=coordinator), COORDINATOR_TIMEOUT_S
        )
        members: list[tuple[str, str | None]] = []
        for response in responses:
            for group in response.groups:
                error_code, group_id, members_at = group[0], group[1], group[5]
                if error_code:
                    raise RuntimeError(f"DescribeGroups {group_id}: error code {error_code}")
                members.extend((member[0], member_url(member[3])) for member in members_at)
        return coordinator, members

    async def leave_group(self, coordinator: int, member_id: str) -> None:
        admin = self._admin
        assert admin is not None
        # v1 (the highest aiokafka has) carries no instance id: the broker then removes the
        # member by its id, static or not.
        response = await asyncio.wait_for(
            admin.send_to_broker(LeaveGroupRequest(self.group_id, member_id), coordinator), COORDINATOR_TIMEOUT_S
        )
        if response.error_code not in (0, UNKNOWN_MEMBER_ID):
            raise RuntimeError(f"LeaveGroup {self.group_id} {member_id}: error code {response.error_code}")

    # -- restarts ----------------------------------------------------------------------

    async def announce_restart(self) -> None:
        self.stopping = True
        peers = sorted(member_urls(self.app) - {self.verdicts.own_url})
        if not peers:
            return
        headers = {"Authorization": f"Bearer {self.settings.admin_token}"}
        body = {"url": self.verdicts.own_url}
        async with httpx.AsyncClient(timeout=ANNOUNCE_TIMEOUT_S) as client:
            results = await asyncio.gather(
                *(client.post(url + RESTARTING_PATH, json=body, headers=headers) for url in peers), return_exceptions=True
            )
        told = [u for u, r in zip(peers, results, strict=True) if isinstance(r, httpx.Response) and r.is_success]
        log.info("told %d of %d peers this instance is restarting (%s)", len(told), len(peers), ", ".join(told) or "none")
