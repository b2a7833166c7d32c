"""Build a service's Faust app and run its worker.

Every service gets the same shape: the RocksDB store (rocksdict, every database sharing one
block cache and memtable budget, see :mod:`shared.engine._rocksdb`; with ``bulk_restore``,
lagging partitions restored in bulk, see :mod:`shared.engine._restore`), a data dir per
service and instance, topics as raw bytes (decoded in the handler, so bad input is a
dead letter and not a crash), at-least-once processing, static group membership,
standby replicas, and a FastAPI app served on the worker's own event loop.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any, TextIO, cast

import faust
from fastapi import FastAPI
from faust.contrib.asgi import serve_asgi
from mode.utils.logging import cry

from shared.engine._admin import TopicSpec
from shared.engine._clients import require_sasl_credentials, ssl_context
from shared.engine._context import AppContext
from shared.engine._faust import TRANSPORT_SCHEME, AppHooks, print_thread_loop_tasks
from shared.engine._instance_lock import hold_data_dir
from shared.engine._membership import ANNOUNCE_TIMEOUT_S, announce_restart
from shared.engine._restore import BulkRestoringTableManager
from shared.engine._rocksdb import STORE_SCHEME, configure_rocksdb_memory
from shared.engine._warmup import WarmupAssignor
from shared.log_config import logging_config
from shared.settings import Settings, env_snapshot

log = logging.getLogger(__name__)

#: The Faust app a service runs on (for type annotations outside the engine).
App = faust.App

#: How old the worker consumer's cluster metadata may get before it is read again (aiokafka's
#: default: 5 minutes). aiokafka's consumer looks up the position of a partition it was just
#: given (or that Faust's recovery seeks to the start or end) from the partition's leader as its
#: metadata names it; when that leader moved, the answer is NotLeaderForPartition, which it logs
#: ("Failed fetch offsets from ...") and asks the same broker again without reading the
#: metadata anew. With nothing else refreshing it, the partition had no position, and its table
#: no restore, for up to 5 minutes after a broker's death; now for at most this long.
CONSUMER_METADATA_MAX_AGE_MS = 10_000


def app_id(service: str, settings: Settings) -> str:
    """Consumer group id and changelog topic prefix of a service."""
    return f"{settings.topic_prefix}statefleet-{service}"


def instance_data_dir(service: str, settings: Settings) -> Path:
    return settings.data_dir / service / settings.instance_id


def broker_credentials(settings: Settings) -> Any:
    proto = settings.kafka_security_protocol
    if proto == "PLAINTEXT":
        return None
    context = ssl_context(settings)
    if proto.startswith("SASL"):
        username, password = require_sasl_credentials(settings)
        return faust.SASLCredentials(
            username=username, password=password, mechanism=settings.kafka_sasl_mechanism, ssl_context=context
        )
    return faust.SSLCredentials(context)


def create_app(service: str, settings: Settings, default_port: int, app_class: type[AppHooks] = AppHooks) -> AppHooks:
    port = settings.port_for(default_port)
    datadir = instance_data_dir(service, settings)
    datadir.mkdir(parents=True, exist_ok=True)
    configure_rocksdb_memory(settings)
    conf: dict[str, Any] = dict(
        broker=[f"{TRANSPORT_SCHEME}://{h.strip()}" for h in settings.kafka_bootstrap_servers.split(",") if h.strip()],
        broker_credentials=broker_credentials(settings),
        store=f"{STORE_SCHEME}://",  # Faust's RocksDB store with one cache and memtable budget per process
        datadir=str(datadir),
        tabledir="tables",
        autodiscover=False,
        topic_partitions=settings.topic_partitions,
        # Unset, the brokers' default: asked for when the worker starts (run_worker), not here,
        # where an app is also built with no broker to ask (the unit tests, the topology driver).
        topic_replication_factor=settings.topic_replication_factor or 1,
        table_standby_replicas=settings.standby_replicas,
        # Every topic the worker reads or writes is created before it starts, by the engine's
        # own admin calls, which wait for a broker that is down or electing leaders
        # (shared/engine/_admin.py; the service's topics, its tables' changelogs and Faust's
        # leader topic, see faust_topic_specs). Faust's declarations at start-up would send
        # the same requests once, and a broker away for that moment ended the worker.
        topic_allow_declare=False,
        # Faust's own exactly_once (its producer per partition, committed on its timer) stays
        # off: with STATEFLEET_PROCESSING_GUARANTEE=exactly_once the engine runs the
        # transactions, one per batch (see shared/engine/_batch.py).
        processing_guarantee="at_least_once",
        producer_acks=-1,
        broker_max_poll_records=settings.consumer_max_poll_records,
        stream_buffer_maxsize=settings.stream_buffer_maxsize,
        broker_session_timeout=settings.session_timeout_s,
        consumer_metadata_max_age_ms=CONSUMER_METADATA_MAX_AGE_MS,
        # Twice a second: in an eager rebalance the members that noticed it first stop
        # processing until the last one rejoins, and a member notices at its next heartbeat.
        broker_heartbeat_interval=min(0.5, settings.session_timeout_s / 5),
        web_enabled=True,
        web_bind=settings.http_host,
        web_port=port,
        canonical_url=settings.url_for(default_port),
        key_serializer="raw",
        value_serializer="raw",
        logging_config=logging_config(service, settings.instance_id, settings.log_level),
        loghandlers=[],
    )
    # Its changelog reader also gives Faust's recovery highwaters it can reach reading
    # committed records (bulk restore itself stays off unless asked for).
    conf["TableManager"] = BulkRestoringTableManager
    # Partitions move only to instances with caught-up copies (see shared/engine/_warmup.py).
    conf["PartitionAssignor"] = WarmupAssignor
    if settings.static_membership:
        conf["consumer_group_instance_id"] = f"{service}-{settings.instance_id}"
    app = app_class(app_id(service, settings), **conf)
    app.engine_context = AppContext(settings, service)
    cast(WarmupAssignor, app.assignor).enabled = settings.warmups
    return app


def faust_topic_specs(app: faust.App, settings: Settings) -> list[TopicSpec]:
    """The compacted changelog topic of every table of ``app``, and Faust's leader topic (one
    partition, given to one member of the group).

    Created before the worker starts, as Faust does not create topics itself (see
    :func:`create_app`); a table written before its new changelog shows in the client's
    metadata would fail with PartitionsMismatch.
    """
    return [
        *(
            TopicSpec(table.changelog_topic.get_topic_name(), table.partitions or settings.topic_partitions, compacted=True)
            for table in app.tables.values()
        ),
        TopicSpec(f"{app.conf.id}-{LEADER_TOPIC_SUFFIX}", 1),
    ]


#: Faust's leader topic is named ``<app id>-`` and this.
LEADER_TOPIC_SUFFIX = "__assignor-__leader"


#: Largest request line and headers the services read (the body has its own limit).
MAX_REQUEST_HEAD_BYTES = 1024 * 1024


def serve_api(app: faust.App, api: FastAPI, settings: Settings, default_port: int) -> None:
    """Serve ``api`` with uvicorn on the Faust worker's event loop."""
    # uvicorn answers a request line and headers over h11's 16 KiB itself, in plain text; with
    # room up to 1 MiB such a request (a huge query string) reaches the API and gets its JSON 4xx.
    serve_asgi(
        app,
        api,
        host=settings.http_host,
        port=settings.port_for(default_port),
        h11_max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES,
        timeout_keep_alive=settings.http_keep_alive_s,
    )


class _Worker(faust.Worker):
    """Faust's worker, with signal handlers of its own (mode's public ``install_signal_handlers``):
    SIGTERM and SIGINT tell the peers this instance is restarting before it stops, and SIGUSR1's
    stack dump includes the consumer thread's tasks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The task that runs :meth:`start` (mode's command line runs it until the worker stops).
        self.starting_task: asyncio.Task[Any] | None = None
        #: The stop a signal began (None until one comes; later signals change nothing).
        self.signal_stop: asyncio.Task[None] | None = None

    def install_signal_handlers(self) -> None:
        self.loop.add_signal_handler(signal.SIGTERM, self.on_stop_signal, signal.SIGTERM)
        self.loop.add_signal_handler(signal.SIGINT, self.on_stop_signal, signal.SIGINT)
        self.loop.add_signal_handler(signal.SIGUSR1, self.on_stack_dump_signal)

    async def start(self) -> None:
        self.starting_task = asyncio.current_task()
        await super().start()
        # The worker's start returns as soon as a stop begins; the command line then shuts the
        # loop down and cancels every task left. A stop a signal began finishes first.
        if self.signal_stop is not None:
            await asyncio.shield(self.signal_stop)

    def on_stop_signal(self, received: signal.Signals) -> None:
        if self.signal_stop is None:
            self.signal_stop = asyncio.ensure_future(self.stop_on_signal(received))

    async def stop_on_signal(self, received: signal.Signals) -> None:
        log.info("signal received: %s; stopping", received.name)
        # First of all: stopping the consumer waits for the running batch and its commit, and
        # only then would Faust's on_before_shutdown run; peers probing meanwhile would find the
        # API gone and remove this member, when a restart keeps it (see _membership).
        try:
            await asyncio.wait_for(announce_restart(cast(faust.App, self.app)), ANNOUNCE_TIMEOUT_S * 2)
        except Exception as exc:
            log.warning("could not tell the peers this instance is restarting: %r", exc)
        await self.stop()
        # A signal during the start (a restore, say) ends the start too, as mode's handler does.
        if self.starting_task is not None and not self.starting_task.done():
            self.starting_task.cancel()

    def on_stack_dump_signal(self) -> None:
        self.add_future(self.dump_stacks())

    async def dump_stacks(self) -> None:
        # SIGUSR1: every thread's stack and the tasks of this (the main) loop, as mode writes
        # them; then the consumer thread's loop (group coordinator, fetcher, the calls Faust
        # hands to it), whose tasks tell where a call to the consumer waits.
        cry(file=cast(TextIO, self.stderr))
        print_thread_loop_tasks(cast(faust.App, self.app), cast(TextIO, self.stderr))


def run_worker(app: faust.App, service: str, settings: Settings) -> None:
    """Run the Faust worker in this process until SIGTERM/SIGINT."""
    log.info("starting %s (instance %s) with %s", service, settings.instance_id, env_snapshot())
    hold_data_dir(instance_data_dir(service, settings), settings.data_dir_lock_wait_s)
    worker = _Worker(app, loglevel=settings.log_level.upper(), logging_config=dict(app.conf.logging_config))
    worker.execute_from_commandline()
