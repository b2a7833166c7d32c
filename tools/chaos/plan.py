"""The chaos run's seeded load: what it writes, decided before it starts.

Each account gets a chain of commands (CreateAccount first, most of the time), some of
them stale, invalid or duplicated, each sent over HTTP or straight onto
``account-commands``; besides them poison bytes, logins and dead letters with full and
partial headers. The reference model sees every command in its chain's order and so
knows every outcome; the load keeps that order by sending an account's next command
only once the previous one is acknowledged.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from tools.chaos.model import ACTIVE, COMMAND_TYPES, CREATE, DEACTIVATE, DELETE, DELETED, INACTIVE, REACTIVATE, UPDATE, Model

Channel = Literal["http", "kafka"]
BASE_MS = 1_700_000_000_000
#: Error classes of the load's own dead letters: retried by the default policy.
RETRIED_CLASSES = ("TimeoutError", "ConnectionError", "ServiceUnavailable")


@dataclass(frozen=True)
class CommandStep:
    command: dict[str, Any]
    channel: Channel
    duplicate: bool = False


@dataclass(frozen=True)
class RecordStep:
    """One record straight onto a topic (a poison command, a login, a dead letter)."""

    kind: Literal["poison", "login", "dead_letter"]
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()
    #: A dead letter whose ``dlq.failed.at`` is the moment it is sent (its backoff runs from then).
    failed_now: bool = False
    duplicate: bool = False


Step = CommandStep | RecordStep


@dataclass(frozen=True)
class DeadLetterSpec:
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]

    @property
    def dlq_id(self) -> str | None:
        return next((v.decode() for k, v in self.headers if k == "dlq.id"), None)


@dataclass
class Plan:
    seed: int
    model: Model
    #: Sent one after the other, each after the previous is acknowledged.
    chains: list[list[Step]] = field(default_factory=list)
    poison: list[bytes] = field(default_factory=list)
    dead_letters: list[DeadLetterSpec] = field(default_factory=list)

    @property
    def commands(self) -> int:
        return len(self.model.outcomes)

    def steps(self) -> int:
        return sum(len(c) for c in self.chains)


def _valid_types(status: str | None) -> list[str]:
    if status is None:
        return [CREATE]
    if status == ACTIVE:
        return [UPDATE, UPDATE, DEACTIVATE, DELETE]
    if status == INACTIVE:
        return [UPDATE, REACTIVATE, REACTIVATE, DELETE]
    return []


def _invalid_types(status: str | None) -> list[str]:
    return [t for t in COMMAND_TYPES if t not in _valid_types(status)]


def _account_chain(rng: random.Random, model: Model, seed: int, program: str, account: str, tag: str) -> list[Step]:
    commands: list[CommandStep] = []
    length = rng.randint(3, 9)
    never_created = rng.random() < 0.1
    for i in range(length):
        state = model.accounts.get(account)
        status = state.status if state is not None else None
        roll = rng.random()
        if i == 0 and not never_created and roll < 0.9:
            type_ = CREATE
        elif never_created:
            type_ = rng.choice([UPDATE, DEACTIVATE, DELETE, REACTIVATE])
        elif roll < 0.65 and _valid_types(status):
            type_ = rng.choice(_valid_types(status))
        elif roll < 0.85 or status == DELETED:
            type_ = rng.choice(_invalid_types(status))
        else:
            type_ = rng.choice(COMMAND_TYPES)
        if never_created and type_ == CREATE:
            type_ = UPDATE
        version = state.version if state is not None else 0
        expected: int | None = None
        v_roll = rng.random()
        if type_ != CREATE and v_roll < 0.35:
            expected = version
        elif type_ != CREATE and v_roll < 0.5:
            expected = rng.randint(1, version - 1) if version > 1 else version + 1  # stale, or from the future
        command = {
            "command_id": f"chaos-{seed}-{tag}-{i}",
            "type": type_,
            "account_id": account,
            "program_id": program if type_ == CREATE else None,
            "expected_version": expected,
            "data": {"step": i, "note": f"{type_} #{i}"} if type_ in (CREATE, UPDATE) else {},
            "issued_at": BASE_MS + i,
        }
        model.apply(command)
        commands.append(CommandStep(command, "http" if rng.random() < 0.5 else "kafka"))
    chain: list[Step] = list(commands)
    # Duplicates: the same command again (same id), a little later, maybe by the other way in.
    for original in commands:
        if rng.random() < 0.15:
            at = min(len(chain), chain.index(original) + 1 + rng.randint(0, 3))
            channel: Channel = "http" if rng.random() < 0.5 else "kafka"
            chain.insert(at, CommandStep(original.command, channel, duplicate=True))
            model.apply(original.command)  # the same outcome, no new event
    return chain


def _poison(rng: random.Random, seed: int, i: int) -> bytes:
    tag = f"chaos-{seed}-poison-{i}"
    shape = rng.randrange(5)
    if shape == 0:
        return b"\xff\xfe\x00" + tag.encode() + bytes(rng.randrange(256) for _ in range(8))  # not UTF-8
    if shape == 1:
        return f"{{not json {tag}".encode()
    if shape == 2:
        return f'["{tag}", 1, 2]'.encode()  # JSON, but not an object
    if shape == 3:
        return f'"{tag}"'.encode()
    return f"{tag} \x00\x01 plain text".encode()


def _dead_letter(rng: random.Random, seed: int, i: int, *, max_attempts: int, retry_topic: str) -> DeadLetterSpec:
    key = None if rng.random() < 0.1 else f"dl-key-{i}".encode()
    value = f"chaos-{seed}-dead-letter-{i}:".encode() + bytes(rng.randrange(256) for _ in range(12))
    headers: list[tuple[str, bytes]] = [("trace-id", f"trace-{seed}-{i}".encode())]
    roll = rng.random()
    error_class = rng.choice(RETRIED_CLASSES)
    if roll < 0.6:  # every header; some at their last attempt
        last = rng.random() < 0.3
        attempt = max_attempts if last else rng.randint(1, max_attempts - 1)
        dlq_id = f"chaos-{seed}/dl/{i}" if rng.random() < 0.2 else f"chaos-{seed}-dl-{i}"
        headers += [
            ("dlq.id", dlq_id.encode()),
            ("dlq.original.topic", b"orders"),
            ("dlq.original.partition", str(rng.randrange(4)).encode()),
            ("dlq.original.offset", str(1000 + i).encode()),
            ("dlq.retry.topic", retry_topic.encode()),
            ("dlq.attempt", str(attempt).encode()),
            ("dlq.error.class", error_class.encode()),
            ("dlq.error.message", f"attempt {attempt} of message {i} failed".encode()),
            ("dlq.first.failed.at", str(BASE_MS).encode()),
        ]
    elif roll < 0.9:  # some headers, no id
        if rng.random() < 0.5:
            headers.append(("dlq.error.class", error_class.encode()))
        if rng.random() < 0.4:
            headers.append(("dlq.attempt", str(rng.choice([1, max_attempts])).encode()))
        if rng.random() < 0.3:
            headers.append(("dlq.original.topic", b"payments"))
    else:  # no headers at all
        headers = []
    return DeadLetterSpec(key, value, tuple(headers))


def build(seed: int, *, duration_s: float, max_attempts: int, retry_topic: str = "retry", programs: int = 4) -> Plan:
    """The whole load for a run of ``duration_s`` seconds (about 1.2 accounts per second)."""
    rng = random.Random(seed)
    model = Model()
    plan = Plan(seed=seed, model=model)
    accounts = max(24, int(duration_s * 1.2))
    program_ids = [f"chaos-{seed}-program-{p}" for p in range(programs)]
    account_ids: list[tuple[str, str]] = []
    for a in range(accounts):
        program = rng.choice(program_ids)
        account = f"chaos-{seed}-acct-{a}" if a % 17 else f"chaos-{seed}/acct {a}"  # a few with / and a space
        account_ids.append((program, account))
        plan.chains.append(_account_chain(rng, model, seed, program, account, f"a{a}"))
    for i in range(max(8, accounts // 6)):
        value = _poison(rng, seed, i)
        plan.poison.append(value)
        key = f"chaos-{seed}-poison-{i}".encode()
        plan.chains.append([RecordStep("poison", key, value)])
        if rng.random() < 0.15:
            plan.chains.append([RecordStep("poison", key, value, duplicate=True)])
    for _ in range(accounts):
        program, account = rng.choice(account_ids)
        ts = rng.randrange(BASE_MS, BASE_MS + 100_000_000_000)
        model.login(program, ts)
        value = json.dumps({"account_id": account, "program_id": program, "ts": ts}).encode()
        plan.chains.append([RecordStep("login", account.encode(), value)])
        if rng.random() < 0.1:
            plan.chains.append([RecordStep("login", account.encode(), value, duplicate=True)])
    for i in range(max(12, accounts // 4)):
        spec = _dead_letter(rng, seed, i, max_attempts=max_attempts, retry_topic=retry_topic)
        plan.dead_letters.append(spec)
        failed_now = spec.dlq_id is not None
        plan.chains.append([RecordStep("dead_letter", spec.key, spec.value, spec.headers, failed_now=failed_now)])
        if rng.random() < 0.1:
            plan.chains.append(
                [RecordStep("dead_letter", spec.key, spec.value, spec.headers, failed_now=failed_now, duplicate=True)]
            )
    return plan
