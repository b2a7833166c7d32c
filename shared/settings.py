"""All configuration, read once from environment variables (prefix ``STATEFLEET_``).

Every field below is one variable: ``kafka_bootstrap_servers`` is
``STATEFLEET_KAFKA_BOOTSTRAP_SERVERS``. docs/configuration.md lists them.
"""

from __future__ import annotations

import hmac
import os
import socket
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]

#: The admin token of local runs. Everyone can read it here, so outside ``env=local``
#: the services refuse to start with it.
DEV_ADMIN_TOKEN = "statefleet-dev-token"
LOCAL_ENV = "local"


class UnsafeSettings(RuntimeError):
    """Settings fit for a local run only, found outside one; the message says what to set."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STATEFLEET_", extra="ignore")

    env: str = Field(
        LOCAL_ENV,
        min_length=1,
        description="Where this runs: local, or e.g. production (set by the Helm chart); outside local runs the "
        "services refuse development defaults such as the admin token",
    )

    # Kafka connection
    kafka_bootstrap_servers: str = Field("127.0.0.1:9092", description="Comma-separated host:port list")
    kafka_security_protocol: SecurityProtocol = "PLAINTEXT"
    kafka_sasl_mechanism: str = Field("SCRAM-SHA-512", description="With SASL_*: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
    kafka_sasl_username: str | None = None
    kafka_sasl_password: str | None = None
    kafka_ssl_cafile: str | None = Field(None, description="CA bundle for SSL/SASL_SSL")
    kafka_ssl_certfile: str | None = None
    kafka_ssl_keyfile: str | None = None

    # Topics
    topic_prefix: str = Field("", description="Prepended to every topic and consumer group name")
    topic_partitions: int = Field(8, ge=1, description="Partitions of the topics the fleet creates")
    topic_replication_factor: int | None = Field(
        None, ge=1, description="Replicas of each topic the fleet creates; unset: the brokers' default.replication.factor"
    )

    # Instance identity and state
    instance_id: str = Field(default_factory=socket.gethostname, description="Unique per instance; static group member id")
    data_dir: Path = Field(Path(".local/data"), description="Root of RocksDB state; each service and instance gets a subfolder")
    data_dir_lock_wait_s: float = Field(
        120.0,
        ge=0,
        description="How long a starting instance waits for its data folder's lock, held by an instance that is still "
        "stopping (a Kubernetes pod deleted with --force can be replaced before its process is gone); then it exits "
        "saying who holds it",
    )
    standby_replicas: int = Field(1, ge=0, description="Standby copies of each table partition kept by other instances")
    static_membership: bool = Field(True, description="Join the consumer group with group.instance.id = service-instance_id")
    bulk_restore: bool = Field(True, description="Restore lagging table partitions with a plain consumer, not record by record")
    bulk_restore_min_lag: int = Field(10_000, ge=1, description="Smallest changelog lag restored in bulk")
    rocksdb_cache_mb: int = Field(
        128,
        ge=8,
        description="RocksDB block cache shared by every table partition of the process (MiB); index and "
        "filter blocks count towards it",
    )
    rocksdb_write_buffer_mb: int = Field(
        64,
        ge=4,
        description="Memtable budget shared by every table partition of the process (MiB): when all "
        "memtables together reach it, the largest are flushed",
    )
    session_timeout_s: float = Field(
        45.0, gt=0, description="A member silent this long leaves the group; a restart within it keeps the assignment"
    )
    restart_grace_s: float = Field(
        20.0,
        ge=0,
        le=3600,
        description="How long peers leave alone the group member of an instance that announced a restart (SIGTERM) "
        "before they remove it, unless it has rejoined meanwhile; at most the session timeout",
    )
    peer_watch: bool = Field(
        True,
        description="Probe the other instances and have the group coordinator drop a dead one's member at once, "
        "so its partitions move within seconds instead of after the session timeout",
    )
    warmups: bool = Field(
        True,
        description="Hand a partition over only to an instance with a caught-up copy of its tables: a new "
        "instance first warms its copies up as standbys, then asks for the rebalance that moves them (KIP-441)",
    )
    warmup_max_lag: int = Field(
        1_000,
        ge=0,
        description="Changelog records a copy may be behind and still count as caught up for a hand-over "
        "(the new owner replays them record by record before it processes)",
    )
    peer_probe_interval_s: float = Field(0.25, gt=0, le=10, description="How often each peer's GET /healthz is probed")
    peer_gone_after_s: float = Field(
        1.0,
        ge=0.5,
        le=60,
        description="A peer whose port refuses or times out on every probe for this long (3 probes at least) is gone",
    )
    peer_refused_gone_after_s: float = Field(
        0.5,
        ge=0.25,
        le=60,
        description="A peer whose port refuses every probe (nothing listens there) for this long (3 probes at least) "
        "is gone; at most peer_gone_after_s",
    )

    # HTTP
    http_host: str = "127.0.0.1"
    http_port: int | None = Field(None, description="Defaults: validator 8001, tallies 8002, retry scheduler 8003, console 8000")
    advertised_url: str | None = Field(None, description="URL peers use to forward queries here; default http://<host>:<port>")
    admin_token: str = Field(DEV_ADMIN_TOKEN, description="Bearer token for changing calls (retry scheduler)")
    tokens_file: str = Field(
        "",
        description="YAML (or JSON) file of the retry scheduler's named tokens, each with its origin topics and "
        "scopes (read, act, admin); empty: the admin token only",
    )
    payloads_require_token: bool = Field(
        False,
        description="The retry scheduler answers a message's key, value and headers only to a token with the read "
        "scope on its origin topic (lists leave them out for the others)",
    )
    max_body_bytes: int = Field(
        786_432,
        ge=1024,
        description="Larger request bodies get 413. 768 KiB holds a batch of 1,000 commands of about 750 bytes, and a "
        "batch travels as one Kafka record, which the broker's default message.max.bytes (1 MB) must admit",
    )
    http_keep_alive_s: int = Field(
        75,
        ge=1,
        description="How long an idle HTTP connection stays open. Longer than the idle time of the clients and load "
        "balancers in front (httpx keeps one 5 s, nginx 75 s): a server that closes first can do so just as a client "
        "sends on it, and that request fails with no answer",
    )
    forward_timeout_s: float = 5.0
    owner_read_timeout_s: float = Field(
        1.0, gt=0, description="Longest wait for the owner's answer to a read before it is answered from a copy"
    )
    read_retry_s: float = Field(
        3.0,
        ge=0,
        description=(
            "Longest a read keeps looking for an instance that can answer it (the owner or a copy) before it answers 503"
        ),
    )
    peer_suspect_s: float = Field(
        2.0, ge=0, description="After a peer failed to answer, how long reads go straight to copies instead of to it"
    )

    # Processing
    processing_guarantee: Literal["at_least_once", "exactly_once"] = Field(
        "at_least_once",
        description="exactly_once: each batch's outputs, changelog rows and input offset are one Kafka transaction, "
        "and every reader of the engine reads committed records only",
    )
    log_level: str = "INFO"
    consumer_max_poll_records: int = Field(
        10000, ge=1, description="Most records one fetch hands over to the batch handlers (all partitions together)"
    )
    stream_buffer_maxsize: int = Field(8192, ge=1)
    consumer_fetch_max_wait_ms: int = Field(
        50,
        ge=0,
        le=60_000,
        description="Longest the broker holds a fetch that found no new records (the next fetch waits for it)",
    )
    trailing_hole_check_s: float = Field(
        5.0, gt=0, description="How often skipped input records with nothing after them are looked for"
    )
    batch_producer_connections: int = Field(
        4,
        ge=1,
        le=16,
        description="Producers (connections) the batch commits send through, in turn: a producer holds one "
        "record batch per partition and has one request in flight per broker, so with one the commits of "
        "batches side by side that write the same partitions go one request after another",
    )

    # Tallies
    tally_publish_interval_s: float = Field(1.0, gt=0, description="How often changed tallies are published")
    tallies_projection: str | None = Field(
        None,
        description="The projection the tallies run, as pkg.module:attr (shared.projection.Projection); "
        "unset: the accounts tallies (services.tallies.domain:PROJECTION)",
    )

    # Validator
    validator_domain: str = Field(
        "", description="The validator's domain as 'pkg.module:attr' (a shared.domain.Domain); empty: the bundled accounts domain"
    )
    command_wait_timeout_s: float = Field(5.0, gt=0, description="Longest wait of POST /commands?wait=true")
    batch_max_commands: int = Field(
        1000, ge=1, le=100_000, description="Most commands in one batch (POST /commands/batch, account-command-batches)"
    )
    command_history_per_account: int = Field(1000, ge=1, description="Command ids remembered per account for idempotency")
    command_outcome_retention_s: float = Field(
        7 * 24 * 3600.0, gt=0, description="How long GET /commands/{id} keeps answering for a command (then 404)"
    )
    command_outcome_catch_up_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="Longest wait of GET /commands/{id} for outcomes already written to be recorded before it answers 404",
    )

    # Retry scheduler
    retry_tick_interval_s: float = Field(1.0, gt=0)
    retry_max_attempts: int = Field(5, ge=1)
    retry_base_delay_ms: int = Field(1000, ge=0)
    retry_max_delay_ms: int = Field(3_600_000, ge=0)
    retry_jitter: Literal["full", "equal", "none"] = "equal"
    retry_policy_overrides: str = Field("", description="JSON: per origin topic / error class overrides, and rules")
    retry_policy_file: str = Field(
        "", description="YAML file of retry policy rules (origin topic and error class, first match wins); empty: none"
    )
    retry_batch_limit: int = Field(5000, ge=1, description="Most entries redelivered per partition per tick")
    retry_metrics_origin_topics: int = Field(
        50, ge=0, description="Origin topics the retry scheduler's counters label by name (the most frequent); the rest: other"
    )
    parked_retention_s: float = Field(
        0.0, ge=0, description="How long a parked message is kept before the scheduler's ticks remove it; 0: for ever"
    )
    retry_ordered_topics: str = Field(
        "", description="Comma-separated origin topics whose dead letters keep per-key order (ordered retries); empty: none"
    )
    retry_ordered_max_held: int = Field(
        1000, ge=0, description="Most records of one key held behind its head in ordered mode; later ones are parked"
    )

    # Operator console (services.console; it listens on STATEFLEET_HTTP_PORT, default 8000)
    console_validator_url: str = Field(
        "http://127.0.0.1:8001",
        description="Validator base URL(s), comma-separated; the first that answers is asked; empty: not deployed",
    )
    console_tallies_url: str = Field("http://127.0.0.1:8002", description="Tallies base URL(s), comma-separated")
    console_retry_scheduler_url: str = Field("http://127.0.0.1:8003", description="Retry scheduler base URL(s), comma-separated")
    console_sample_interval_s: float = Field(2.0, gt=0, description="How often the console polls every instance")
    console_history_s: float = Field(600.0, gt=0, description="How far back the fleet page's records/s chart goes")
    console_refresh_s: float = Field(3.0, gt=0, description="How often an open fleet page refreshes itself")
    console_upstream_timeout_s: float = Field(5.0, gt=0, description="Longest wait for one call to a service")

    def check_deployable(self) -> None:
        """Raise :class:`UnsafeSettings` when a non-local run has settings only a local run may have."""
        if self.env == LOCAL_ENV:
            return
        token = self.admin_token.encode()
        if not token.strip() or hmac.compare_digest(token, DEV_ADMIN_TOKEN.encode()):
            raise UnsafeSettings(
                f"STATEFLEET_ENV is {self.env!r}, but STATEFLEET_ADMIN_TOKEN is "
                f"{'empty' if not token.strip() else 'the development default'}: anyone could replay or cancel "
                "messages. Set STATEFLEET_ADMIN_TOKEN to a secret of your own (the Helm chart takes it from its "
                "admin Secret), or STATEFLEET_ENV=local for a local run."
            )

    @property
    def effective_restart_grace_s(self) -> float:
        """The restart grace in force: past the session timeout the broker removes the member anyway."""
        return min(self.restart_grace_s, self.session_timeout_s)

    def port_for(self, service_default: int) -> int:
        return self.http_port if self.http_port is not None else service_default

    def url_for(self, service_default: int) -> str:
        if self.advertised_url:
            return self.advertised_url.rstrip("/")
        host = self.http_host if self.http_host not in ("0.0.0.0", "::") else socket.gethostname()
        return f"http://{host}:{self.port_for(service_default)}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def env_snapshot() -> dict[str, str]:
    """The STATEFLEET_ variables in force, for logging at start-up (secrets masked)."""
    masked = ("PASSWORD", "TOKEN")
    return {
        k: ("***" if any(m in k for m in masked) else v) for k, v in sorted(os.environ.items()) if k.startswith("STATEFLEET_")
    }
