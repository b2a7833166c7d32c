"""The engine names the topics a service owns from its registrations: the topics its handlers
read as internal, with their partition counts, its tables' changelogs and Faust's leader topic."""

from __future__ import annotations

from pathlib import Path

from shared.engine import Engine, InputBatch, TopicSpec
from shared.settings import Settings


async def handle(batch: InputBatch) -> None:
    pass


def test_internal_topics_and_changelogs_come_from_the_registrations(tmp_path: Path) -> None:
    engine = Engine("probe", Settings(data_dir=tmp_path, topic_partitions=4), 8999)
    store = engine.table("counts")
    engine.handler("events", name="inputs", offsets=store)(handle)
    engine.handler("probe-hop-a", "probe-hop-b", name="hop", offsets=store, internal_partitions=2)(handle)

    specs = engine.internal_topic_specs()

    assert specs[:2] == [TopicSpec("probe-hop-a", 2), TopicSpec("probe-hop-b", 2)]
    [changelog, leader] = specs[2:]
    assert changelog.name.endswith("counts-changelog") and changelog.partitions == 4 and changelog.compacted
    # Faust's leader topic too: Faust creates no topic itself, a broker away at start-up would end it
    assert leader == TopicSpec("statefleet-probe-__assignor-__leader", 1)
    assert "events" not in {spec.name for spec in specs}, "a topic read but not declared internal is not the service's"
