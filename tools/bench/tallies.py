"""Tally benchmark: N input events pre-loaded, then the time one tallies worker takes to
consume them all and settle the tallies, next to a bare aiokafka consumer reading the
same topics in the same run.

    python -m tools.bench tallies --events 1000000 --programs 1000

Method: events go to ``<prefix>account-events`` (accounts created, some deactivated,
reactivated or deleted) and ``<prefix>logins`` (a quarter of N). The baseline reads
both topics from the beginning with one AIOKafkaConsumer. Then one worker starts on an
empty data dir; the clock runs from its /readyz answering 200 until its
``statefleet_messages_processed_total{stream="by-program"}`` counter reaches N (both
hops done), and the tallies of sampled programs are checked against the counts the
generator knows by construction.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import time
import uuid
from collections.abc import Iterator

import orjson

from shared.engine.clients import TopicSpec, ensure_topics_async
from shared.settings import Settings
from tools import web
from tools.bench import results
from tools.bench.common import bootstrap, machine, produce_bulk, raw_consume_rate, service_worker

LIFECYCLES = (
    (["AccountCreated"], "active"),
    (["AccountCreated", "AccountDeactivated"], "inactive"),
    (["AccountCreated", "AccountDeactivated", "AccountReactivated"], "active"),
    (["AccountCreated", "AccountUpdated", "AccountDeleted"], "deleted"),
)


def generate(
    n_events: int, programs: int, seed: int = 42
) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]], dict[str, list[int]]]:
    rng = random.Random(seed)
    n_logins = n_events // 4
    events: list[tuple[bytes, bytes]] = []
    expected: dict[str, list[int]] = {}
    account = 0
    while len(events) < n_events - n_logins:
        program = f"program-{account % programs}"
        types, final = LIFECYCLES[rng.randrange(len(LIFECYCLES))]
        types = types[: n_events - n_logins - len(events)]
        final = (
            {
                "AccountCreated": "active",
                "AccountUpdated": "active",
                "AccountDeactivated": "inactive",
                "AccountReactivated": "active",
                "AccountDeleted": "deleted",
            }[types[-1]]
            if types
            else final
        )
        acct = f"acct-{account}"
        for version, type_ in enumerate(types, start=1):
            events.append(
                (
                    acct.encode(),
                    orjson.dumps(
                        {
                            "event_id": f"{acct}:{version}",
                            "command_id": f"c-{acct}-{version}",
                            "type": type_,
                            "account_id": acct,
                            "program_id": program,
                            "version": version,
                            "occurred_at": version,
                            "data": {},
                        }
                    ),
                )
            )
        counts = expected.setdefault(program, [0, 0, -1])
        counts[0] += final == "active"
        counts[1] += final == "inactive"
        account += 1
    logins = []
    for i in range(n_logins):
        acct_n = rng.randrange(account)
        program = f"program-{acct_n % programs}"
        ts = 1_700_000_000_000 + i
        login = {"account_id": f"acct-{acct_n}", "program_id": program, "ts": ts}
        logins.append((f"acct-{acct_n}".encode(), orjson.dumps(login)))
        expected.setdefault(program, [0, 0, -1])[2] = max(expected[program][2], ts)
    return events, logins, expected


def processed(url: str) -> int:
    text = web.get(url + "/metrics", timeout=5).text
    m = re.search(r'statefleet_messages_processed_total\{service="tallies",stream="by-program"\} ([0-9.e+]+)', text)
    return int(float(m.group(1))) if m else 0


def _iter(records: list[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
    yield from records


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench tallies")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--programs", type=int, default=1000)
    parser.add_argument("--port", type=int, default=18002)
    args, _ = parser.parse_known_args(argv)

    prefix = f"bench{uuid.uuid4().hex[:8]}."
    settings = Settings(kafka_bootstrap_servers=bootstrap(), topic_prefix=prefix)
    events_topic, logins_topic = f"{prefix}account-events", f"{prefix}logins"
    print(f"[bench] machine: {machine()}; prefix {prefix}", flush=True)
    events, logins, expected = generate(args.events, args.programs)
    asyncio.run(ensure_topics_async(settings, [TopicSpec(events_topic, 8), TopicSpec(logins_topic, 8)]))
    t0 = time.perf_counter()
    asyncio.run(produce_bulk(events_topic, _iter(events)))
    asyncio.run(produce_bulk(logins_topic, _iter(logins)))
    total = len(events) + len(logins)
    print(f"[bench] pre-loaded {total:,} events in {time.perf_counter() - t0:.1f}s", flush=True)

    n, secs = asyncio.run(raw_consume_rate([events_topic, logins_topic], total))
    raw_rate = n / secs
    print(f"[bench] baseline: bare aiokafka consumer read {n:,} in {secs:.2f}s = {raw_rate:,.0f} events/s", flush=True)

    with service_worker("tallies", prefix, args.port) as url:
        started = time.perf_counter()
        last_report = started
        while (done := processed(url)) < total:
            time.sleep(0.25)
            if time.perf_counter() - last_report > 10:
                last_report = time.perf_counter()
                print(f"[bench]   worker processed {done:,}/{total:,}", flush=True)
        secs = time.perf_counter() - started
        rate = total / secs
        sample = random.Random(1).sample(sorted(expected), min(20, len(expected)))
        time.sleep(0.5)
        wrong = []
        for program in sample:
            got = web.get(f"{url}/tallies/{program}", timeout=5).json()
            a, i, last = expected[program]
            if (got["numberActive"], got["numberInactive"], got["lastLogin"] or -1) != (a, i, last):
                wrong.append((program, got, expected[program]))
        print(
            f"[bench] tallies worker: {total:,} events in {secs:.2f}s = {rate:,.0f} events/s "
            f"({rate / raw_rate:.1%} of the bare consumer); {len(sample) - len(wrong)}/{len(sample)} sampled tallies exact",
            flush=True,
        )
        if wrong:
            print(f"[bench] MISMATCH: {wrong[:3]}", flush=True)
        else:
            results.record("tallies.one_worker", rate, "events/s", baseline=raw_rate)
