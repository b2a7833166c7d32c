"""Warm-up copies: the assignor hands a partition over only to a member with a caught-up copy."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from faust.assignor.client_assignment import ClientAssignment, ClientMetadata, CopartitionedAssignment

from shared.engine._warmup import (
    StatefleetClientMetadata,
    WarmupAssignor,
    WarmupWatch,
    hand_over_to_caught_up,
    hold_until_warm,
    rejoin_for_peer,
)
from shared.settings import Settings

PARTITIONS = 8
SOURCE = "account-events"


def copart(actives: set[int], standbys: set[int] | None = None) -> CopartitionedAssignment:
    return CopartitionedAssignment(actives=set(actives), standbys=set(standbys or set()), topics={"t"})


def test_a_member_under_its_share_takes_over_what_it_holds_caught_up_from_the_most_loaded() -> None:
    members = {"a": copart({0, 1, 2, 3, 4}), "b": copart({5, 6, 7}), "new": copart(set(), {1, 6})}
    moves = hand_over_to_caught_up(members, PARTITIONS, lambda m, p: m == "new" and p in {1, 6})
    assert moves == [(1, "a", "new"), (6, "b", "new")]
    assert members["new"].actives == {1, 6} and members["new"].standbys == set()
    assert members["a"].actives == {0, 2, 3, 4} and members["b"].actives == {5, 7}


def test_nothing_moves_without_a_caught_up_copy_or_from_a_member_at_its_share() -> None:
    members = {"a": copart({0, 1, 2, 3}), "b": copart({4, 5, 6, 7}), "new": copart(set())}
    assert hand_over_to_caught_up(members, PARTITIONS, lambda m, p: False) == []
    members = {"a": copart({0, 1, 2}), "b": copart({3, 4, 5}), "c": copart({6, 7})}
    # c is at its share (8 // 3 = 2): a caught-up copy alone moves nothing.
    assert hand_over_to_caught_up(members, PARTITIONS, lambda m, p: True) == []


def test_a_cold_hand_over_is_undone_while_the_owner_is_a_member() -> None:
    assigned = {"a": copart({0, 2}, {5}), "b": copart({4, 5}), "new": copart({1, 3, 6, 7})}
    previous_owner = {0: "a", 1: "a", 2: "a", 3: "a", 4: "b", 5: "b", 6: "b", 7: "gone"}
    warm = {("new", 3)}
    warmups = hold_until_warm(assigned, previous_owner, lambda m, p: (m, p) in warm)
    # 3 is caught up there, 7's owner is not in the group: both stay. 1 and 6 go back, warmed up.
    assert warmups == {"new": {1, 6}}
    assert assigned["new"].actives == {3, 7} and assigned["new"].standbys == {1, 6}
    assert assigned["a"].actives == {0, 1, 2} and assigned["b"].actives == {4, 5, 6}
    assert sum(len(a.actives) for a in assigned.values()) == PARTITIONS


def test_the_metadata_carries_copies_and_warm_ups_and_faust_reads_it() -> None:
    meta = StatefleetClientMetadata(
        assignment=ClientAssignment(actives={"t": [1]}, standbys={}),
        url="http://a",
        changelog_distribution={},
        external_topic_distribution={},
        topic_groups={},
        caught_up={"t-changelog": [1, 2]},
        warmups={"t-changelog": [3]},
    )
    plain = ClientMetadata.loads(meta.dumps())
    assert plain.assignment.actives == {"t": [1]}
    assert plain.caught_up == {"t-changelog": [1, 2]}  # type: ignore[attr-defined]


# -- the assignor, with Faust's own objects ------------------------------------------------------


class Cluster:
    def __init__(self, topics: list[str]) -> None:
        self.topics = topics

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(PARTITIONS))


def changelog(assignor: WarmupAssignor) -> str:
    return next(iter(assignor.changelog_topics))


def member(assignor: WarmupAssignor, url: str, actives: list[int], caught_up: list[int] | None) -> Any:
    topics = [SOURCE, changelog(assignor)]
    meta = ClientMetadata(
        assignment=ClientAssignment(actives={t: actives for t in topics}, standbys={}),
        url=url,
        changelog_distribution={},
        external_topic_distribution={},
        topic_groups={},
    )
    raw = json.loads(meta.dumps())
    if caught_up is not None:
        raw["caught_up"] = {changelog(assignor): caught_up}
    return ConsumerProtocolMemberMetadata(4, topics, json.dumps(raw).encode())


def decode(assignment: Any) -> dict[str, Any]:
    return dict(json.loads(zlib.decompress(assignment.user_data)))


def test_a_new_member_without_copies_warms_up_and_takes_nothing_over(assignor: WarmupAssignor) -> None:
    cl = changelog(assignor)
    assignor.small = {cl: []}  # the leader has measured: no changelog is small
    members = {
        "m-a": member(assignor, "http://a", [0, 1, 2, 3], list(range(PARTITIONS))),
        "m-b": member(assignor, "http://b", [4, 5, 6, 7], list(range(PARTITIONS))),
        "m-new": member(assignor, "http://new", [], []),
    }
    out = assignor.assign(Cluster([SOURCE, cl]), members)  # type: ignore[arg-type]
    new = decode(out["m-new"])
    assert new["assignment"]["actives"][SOURCE] == []
    # Warm-ups are standbys (besides those Faust gives it as replicas).
    assert new["warmups"][cl] and set(new["warmups"][cl]) <= set(new["assignment"]["standbys"][cl])
    owned = sorted(decode(out["m-a"])["assignment"]["actives"][SOURCE] + decode(out["m-b"])["assignment"]["actives"][SOURCE])
    assert owned == list(range(PARTITIONS))


def test_once_caught_up_the_new_member_takes_its_share(assignor: WarmupAssignor) -> None:
    cl = changelog(assignor)
    members = {
        "m-a": member(assignor, "http://a", [0, 1, 2, 3], list(range(PARTITIONS))),
        "m-b": member(assignor, "http://b", [4, 5, 6, 7], list(range(PARTITIONS))),
        "m-new": member(assignor, "http://new", [], [2, 3, 6]),
    }
    out = assignor.assign(Cluster([SOURCE, cl]), members)  # type: ignore[arg-type]
    new = decode(out["m-new"])
    assert sorted(new["assignment"]["actives"][SOURCE]) == [2, 6]  # its share of 8 // 3, from each donor
    assert new["warmups"] == {}
    assert [m[1:] for m in assignor.last_moves] == [(2, "m-a", "m-new"), (6, "m-b", "m-new")]  # one table


def test_members_that_report_no_copies_get_fausts_assignment(assignor: WarmupAssignor) -> None:
    cl = changelog(assignor)
    members = {
        "m-a": member(assignor, "http://a", [0, 1, 2, 3], None),
        "m-b": member(assignor, "http://b", [4, 5, 6, 7], None),
        "m-new": member(assignor, "http://new", [], None),
    }
    out = assignor.assign(Cluster([SOURCE, cl]), members)  # type: ignore[arg-type]
    assert decode(out["m-new"])["assignment"]["actives"][SOURCE] != []
    assert assignor.last_holds == {}


def test_a_gone_owners_partitions_are_not_held(assignor: WarmupAssignor) -> None:
    cl = changelog(assignor)
    members = {"m-a": member(assignor, "http://a", [0, 1, 2, 3], [0, 1, 2, 3]), "m-new": member(assignor, "http://new", [], [])}
    out = assignor.assign(Cluster([SOURCE, cl]), members)  # type: ignore[arg-type]
    a = decode(out["m-a"])["assignment"]["actives"][SOURCE]
    new = decode(out["m-new"])["assignment"]["actives"][SOURCE]
    assert sorted(a + new) == list(range(PARTITIONS))
    assert {4, 5, 6, 7} <= set(a) | set(new) and set(new) & {0, 1, 2, 3} == set()


def test_a_disabled_assignor_reports_no_copies(assignor: WarmupAssignor) -> None:
    assignor.caught_up = {"x": [1]}
    assert "caught_up" in json.loads(assignor.join_metadata().dumps())
    assignor.enabled = False
    assert "caught_up" not in json.loads(assignor.join_metadata().dumps())


# -- the member's probe --------------------------------------------------------------------------


class FakeApp:
    rebalancing = False

    def __init__(self, assignor: Any) -> None:
        self.assignor = assignor


class FakeAssignor:
    warmups: dict[str, list[int]] = {}
    assigned_at = 0.0


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> WarmupWatch:
    monkeypatch.setattr("shared.engine._warmup.recovery_done", lambda app: True)
    w = WarmupWatch(FakeApp(FakeAssignor()), Settings(), "http://self")  # type: ignore[arg-type]
    return w


def test_a_member_asks_for_a_rebalance_once_every_warm_up_is_caught_up(watch: WarmupWatch) -> None:
    watch.assignor.warmups = {"c": [1, 2]}
    assert not watch.due({"c": [1]}, now=10.0)
    assert watch.due({"c": [1, 2, 5]}, now=10.0)


def test_no_rebalance_is_asked_for_right_after_one(watch: WarmupWatch) -> None:
    watch.assignor.warmups = {"c": [1, 2]}
    watch.assignor.assigned_at = 8.0
    assert not watch.due({"c": [1, 2]}, now=10.0)
    assert watch.due({"c": [1, 2]}, now=13.1)


def test_some_warm_ups_caught_up_are_enough_after_a_while_and_probes_are_spaced(watch: WarmupWatch) -> None:
    watch.assignor.warmups = {"c": [1, 2]}
    assert watch.due({"c": [1]}, now=31.0)
    watch._probed_at = 31.0
    assert not watch.due({"c": [1, 2]}, now=33.0)
    assert watch.due({"c": [1, 2]}, now=36.1)


def test_no_warm_ups_no_rebalance(watch: WarmupWatch) -> None:
    watch.assignor.warmups = {}
    assert not watch.due({"c": [1, 2]}, now=100.0)


def test_a_leaving_members_partitions_go_to_the_members_with_their_standbys(assignor: WarmupAssignor) -> None:
    """Scale-in: nothing is held for a member that is gone, and Faust's assignment promotes the
    standby copies, which the members report caught up."""
    cl = changelog(assignor)
    topics = [SOURCE, cl]

    def with_standbys(url: str, actives: list[int], standbys: list[int]) -> Any:
        meta = ClientMetadata(
            assignment=ClientAssignment(actives={t: actives for t in topics}, standbys={cl: standbys, SOURCE: standbys}),
            url=url,
            changelog_distribution={},
            external_topic_distribution={},
            topic_groups={},
        )
        raw = json.loads(meta.dumps())
        raw["caught_up"] = {cl: sorted(actives + standbys)}
        return ConsumerProtocolMemberMetadata(4, topics, json.dumps(raw).encode())

    # c (partitions 6, 7) has left; a kept a standby of 6, b of 7.
    members = {"m-a": with_standbys("http://a", [0, 1, 2], [3, 6]), "m-b": with_standbys("http://b", [3, 4, 5], [0, 7])}
    out = assignor.assign(Cluster(topics), members)  # type: ignore[arg-type]
    a = set(decode(out["m-a"])["assignment"]["actives"][SOURCE])
    b = set(decode(out["m-b"])["assignment"]["actives"][SOURCE])
    assert 6 in a and 7 in b
    assert a | b == set(range(PARTITIONS)) and assignor.last_holds == {}


def test_a_small_changelog_is_handed_over_even_to_a_member_that_reports_no_copies(assignor: WarmupAssignor) -> None:
    """A member that joins before it measured its copies reports none; partitions whose whole
    changelog is within the bound (as the leader last measured) need no warm-up."""
    cl = changelog(assignor)
    assignor.small = {cl: list(range(PARTITIONS))}
    members = {
        "m-a": member(assignor, "http://a", [0, 1, 2, 3], list(range(PARTITIONS))),
        "m-b": member(assignor, "http://b", [4, 5, 6, 7], list(range(PARTITIONS))),
        "m-new": member(assignor, "http://new", [], []),
    }
    out = assignor.assign(Cluster([SOURCE, cl]), members)  # type: ignore[arg-type]
    assert decode(out["m-new"])["assignment"]["actives"][SOURCE] != []
    assert assignor.last_holds == {}


def test_only_another_member_of_the_group_can_ask_for_a_rebalance(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[object] = []
    monkeypatch.setattr("shared.engine._warmup.member_urls", lambda app: {"http://a", "http://b"})

    def request_rejoin(app: object) -> bool:
        asked.append(app)
        return True

    monkeypatch.setattr("shared.engine._warmup.request_rejoin", request_rejoin)
    assert not rejoin_for_peer(object(), "http://stranger", "http://a")  # type: ignore[arg-type]
    assert not rejoin_for_peer(object(), "http://a/", "http://a")  # type: ignore[arg-type]
    assert asked == []
    assert rejoin_for_peer(object(), "http://b", "http://a")  # type: ignore[arg-type]
    assert len(asked) == 1


def test_a_leader_that_has_not_measured_the_changelogs_holds_nothing(assignor: WarmupAssignor) -> None:
    """A fleet starting at once: the first member leads before it has measured anything."""
    cl = changelog(assignor)
    assert assignor.small is None
    members = {"m-a": member(assignor, "http://a", list(range(PARTITIONS)), []), "m-new": member(assignor, "http://new", [], [])}
    out = assignor.assign(Cluster([SOURCE, cl]), members)  # type: ignore[arg-type]
    assert decode(out["m-new"])["assignment"]["actives"][SOURCE] != []
    assert assignor.last_holds == {}
