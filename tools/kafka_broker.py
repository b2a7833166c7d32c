"""A real single-node Apache Kafka broker (KRaft) for local runs and tests.

The broker's jars are resolved from Maven Central by ``broker/pom.xml``; storage is
formatted once; the broker runs in the background with its pid, log and log dirs
under ``.local/broker`` (git-ignored). Every entry point is idempotent: ``start``
finds a running broker and returns, ``stop`` on a stopped broker does nothing.

Used by ``make broker`` / ``make down`` and by the pytest fixture, so tests and
local runs start the broker through the same code.

With ``--secure`` the same commands run a second broker, under ``.local/broker-secure`` on
port 9096 (``STATEFLEET_SECURE_BROKER_HOME``, ``STATEFLEET_SECURE_BROKER_PORT``), whose one
client listener is SASL_SSL: SCRAM-SHA-512 users, a certificate from a CA made for it (openssl), and
ACLs (StandardAuthorizer) that let each service's user do only what that service does
(see ``tools/kafka_acls.py`` and docs/security.md). ``env --secure --user U`` prints the
settings a client connects with as U.

With ``--brokers N`` (``STATEFLEET_BROKERS``, ``make broker BROKERS=3``) the plaintext broker is
a replicated cluster of N KRaft nodes, each a combined broker and controller run from the same
jars: node i (from 1) listens on ``port + 100*(i-1)`` with its controller one above, and keeps
its config, pid, log and log dirs under ``home/node-<i>``; internal topics and new topics get
replication 3 (min ISR 2). The node count a home was formatted with is kept in its
``cluster.json``, so ``stop``, ``status`` and the tests find every node without being told.
:func:`node_states`, :func:`kill_node`, :func:`start_node` and :func:`partition_leaders` are what
the chaos run and the tests use to kill and bring back single nodes.

    python -m tools.kafka_broker [--secure] [--brokers N] start|stop|status|jars|grant|env
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from tools.processes import exited

if TYPE_CHECKING:
    from tools.kafka_acls import Acl

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
BROKER_SRC = REPO / "broker"


class BrokerError(RuntimeError):
    """The broker could not be prepared or started; the message says what to do."""


#: How far apart the ports of neighbouring nodes of a cluster are by default: node i listens on
#: ``port + NODE_PORT_STEP * (i - 1)`` (9092, 9192, 9292), clear of the secure broker's 9096/9097.
NODE_PORT_STEP = 100

#: Heap per node of a cluster when ``STATEFLEET_BROKER_HEAP`` does not say: three nodes of the
#: single broker's 1 GiB would take 3 GiB on a machine the tests and services share.
CLUSTER_NODE_HEAP = "512m"


@dataclass(frozen=True)
class BrokerNode:
    """One KRaft node (broker and controller in one process) of a layout."""

    node_id: int
    #: The node's own folder: the layout's home for a single node, ``home/node-<id>`` in a cluster.
    home: Path
    host: str
    port: int
    controller_port: int

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def config(self) -> Path:
        return self.home / "server.properties"

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "broker.log"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class BrokerLayout:
    home: Path
    port: int = 9092
    controller_port: int = 9093
    #: The address both listeners bind to and advertise (a Kubernetes cluster on this machine
    #: reaches the broker on its bridge address: ``STATEFLEET_BROKER_HOST``).
    host: str = "127.0.0.1"
    #: One SASL_SSL listener (SCRAM-SHA-512) with ACLs, instead of PLAINTEXT for all.
    secure: bool = False
    #: Where the jars are, when not under ``home`` (the secure broker runs the plaintext one's).
    libs_dir: Path | None = None
    #: KRaft nodes (broker and controller each): 1 is the single broker, more a replicated cluster.
    brokers: int = 1
    #: Node i's ports are ``port + port_step * (i - 1)`` and one above (``STATEFLEET_BROKER_PORT_STEP``).
    port_step: int = NODE_PORT_STEP

    @property
    def libs(self) -> Path:
        return self.libs_dir or self.home / "libs"

    @property
    def nodes(self) -> tuple[BrokerNode, ...]:
        return tuple(self.node(node_id) for node_id in range(1, self.brokers + 1))

    def node(self, node_id: int) -> BrokerNode:
        if not 1 <= node_id <= self.brokers:
            raise BrokerError(f"no node {node_id}: the layout in {self.home} has nodes 1 to {self.brokers}")
        offset = self.port_step * (node_id - 1)
        return BrokerNode(
            node_id=node_id,
            home=self.home if self.brokers == 1 else self.home / f"node-{node_id}",
            host=self.host,
            port=self.port + offset,
            controller_port=self.controller_port + offset,
        )

    # A single broker's files (node 1's, in a cluster).
    @property
    def data(self) -> Path:
        return self.node(1).data

    @property
    def config(self) -> Path:
        return self.node(1).config

    @property
    def pid_file(self) -> Path:
        return self.node(1).pid_file

    @property
    def log_file(self) -> Path:
        return self.node(1).log_file

    @property
    def bootstrap(self) -> str:
        """Every node's address, comma-separated (one address for a single broker)."""
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def cluster_file(self) -> Path:
        """A cluster's node count and cluster id, written when its storage is formatted."""
        return self.home / "cluster.json"

    @property
    def tls_dir(self) -> Path:
        return self.home / "tls"

    @property
    def ca_file(self) -> Path:
        """The CA certificate (PEM) clients trust the broker's certificate with."""
        return self.tls_dir / "ca.pem"

    @property
    def credentials_file(self) -> Path:
        """The password of every SCRAM user, made at the first start (JSON, mode 600)."""
        return self.home / "credentials.json"


def formatted_brokers(home: Path) -> int | None:
    """The node count of the cluster formatted in ``home``, if one was."""
    try:
        return int(json.loads((home / "cluster.json").read_text())["brokers"])
    except (FileNotFoundError, KeyError, ValueError):
        return None


def default_layout() -> BrokerLayout:
    home = Path(os.environ.get("STATEFLEET_BROKER_HOME", REPO / ".local" / "broker"))
    port = int(os.environ.get("STATEFLEET_BROKER_PORT", "9092"))
    controller_port = int(os.environ.get("STATEFLEET_BROKER_CONTROLLER_PORT", str(port + 1)))
    host = os.environ.get("STATEFLEET_BROKER_HOST", "127.0.0.1")
    # Unset: as many nodes as the home was formatted with, so that make down, make status and
    # the tests reach a cluster make broker BROKERS=3 started without being told again.
    brokers = int(os.environ.get("STATEFLEET_BROKERS") or formatted_brokers(home) or 1)
    step = int(os.environ.get("STATEFLEET_BROKER_PORT_STEP", str(NODE_PORT_STEP)))
    return BrokerLayout(home=home, port=port, controller_port=controller_port, host=host, brokers=brokers, port_step=step)


def secure_layout() -> BrokerLayout:
    """The secure broker's own home and ports, so that it runs beside the plaintext one."""
    home = Path(os.environ.get("STATEFLEET_SECURE_BROKER_HOME", REPO / ".local" / "broker-secure"))
    port = int(os.environ.get("STATEFLEET_SECURE_BROKER_PORT", "9096"))
    controller_port = int(os.environ.get("STATEFLEET_SECURE_BROKER_CONTROLLER_PORT", str(port + 1)))
    host = os.environ.get("STATEFLEET_SECURE_BROKER_HOST", "127.0.0.1")
    # The same jars as the plaintext broker: resolved once for both.
    return BrokerLayout(
        home=home, port=port, controller_port=controller_port, host=host, secure=True, libs_dir=default_layout().libs
    )


def _log(msg: str) -> None:
    print(f"[broker] {msg}", file=sys.stderr, flush=True)


def check_toolchain() -> None:
    """Fail with one line saying what to install when Java 17+ or Maven is missing."""
    java = shutil.which("java")
    if java is None:
        raise BrokerError("Java 17+ is required to run the Kafka broker: install a JDK (apt-get install openjdk-17-jdk-headless)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    version = _java_major(out)
    if version is not None and version < 17:
        raise BrokerError(f"Java 17+ is required to run the Kafka broker, found Java {version}: install a newer JDK")
    if shutil.which("mvn") is None:
        raise BrokerError("Maven is required to resolve the Kafka broker's jars: install it (e.g. apt-get install maven)")


def _java_major(version_output: str) -> int | None:
    for token in version_output.split('"')[1:2]:
        head = token.split(".")[0]
        if head == "1":  # "1.8.0_x" style
            return int(token.split(".")[1])
        if head.isdigit():
            return int(head)
    return None


def resolve_jars(layout: BrokerLayout) -> None:
    """Copy the broker's runtime jars from Maven Central into ``libs`` (once)."""
    stamp = layout.libs / ".resolved"
    pom = BROKER_SRC / "pom.xml"
    if stamp.exists() and stamp.read_text() == pom.read_text():
        return
    check_toolchain()
    _log(f"resolving Kafka jars from Maven Central into {layout.libs}")
    if layout.libs.exists():
        shutil.rmtree(layout.libs)
    layout.libs.mkdir(parents=True)
    cmd = [
        "mvn",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={layout.libs}",
        "-DincludeScope=runtime",
    ]
    returncode, tail = _run_maven(cmd)
    if returncode != 0:
        raise BrokerError("Maven could not resolve the broker's jars:\n" + "\n".join(tail))
    stamp.write_text(pom.read_text())


class MavenProgress:
    """Condenses Maven's output to a progress line every ``interval`` seconds at most.

    A first run downloads a few hundred files (Maven's plugins, then Kafka's jars);
    one line per file would flood the terminal, none at all looks like a hang.
    """

    def __init__(self, interval: float = 2.0) -> None:
        self.interval = interval
        self.files = 0
        self.last_file = ""
        self._last_report = float("-inf")

    def feed(self, line: str, now: float) -> str | None:
        """The progress line to show after ``line``, if one is due."""
        text = line.strip()
        if text.startswith("[INFO] "):
            text = text[len("[INFO] ") :]
        if text.startswith("Downloaded from "):
            self.files += 1
            url = text.split(": ", 1)[-1].split(" ", 1)[0]
            self.last_file = url.rsplit("/", 1)[-1]
        elif not text.startswith("Copying "):
            return None
        if now - self._last_report < self.interval:
            return None
        self._last_report = now
        if text.startswith("Copying "):
            return f"Maven: {text}"
        return f"Maven: {self.files} files downloaded (latest {self.last_file})"

    def summary(self) -> str:
        return f"Maven: done, {self.files} files downloaded" if self.files else "Maven: done (all files were cached)"


def _run_maven(cmd: list[str]) -> tuple[int, list[str]]:
    """Run Maven showing condensed progress; its exit code and the last lines it wrote."""
    progress = MavenProgress()
    tail: list[str] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = [*tail[-199:], line.rstrip("\n")]
        shown = progress.feed(line, time.monotonic())
        if shown:
            _log(shown)
    returncode = proc.wait()
    if returncode == 0:
        _log(progress.summary())
    return returncode, tail


def _java_cmd(layout: BrokerLayout, main_class: str, *args: str) -> list[str]:
    """The JVM's command line: ``STATEFLEET_BROKER_HEAP`` sizes the heap (1 GiB for a single
    broker, 512 MiB per node of a cluster unless it says), and the options in
    ``STATEFLEET_BROKER_JAVA_OPTS`` come after the defaults, so they can override them (``make
    test`` sets ``-XX:TieredStopAtLevel=1``; see the Makefile)."""
    heap = os.environ.get("STATEFLEET_BROKER_HEAP") or ("1g" if layout.brokers == 1 else CLUSTER_NODE_HEAP)
    return [
        "java",
        f"-Xmx{heap}",
        f"-Xms{heap}",
        "-XX:+UseG1GC",
        *os.environ.get("STATEFLEET_BROKER_JAVA_OPTS", "").split(),
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={BROKER_SRC / 'log4j2.properties'}",
        "-cp",
        f"{layout.libs}/*",
        main_class,
        *args,
    ]


def cluster_properties(layout: BrokerLayout, node: BrokerNode) -> str:
    """What a node of a cluster sets differently from the single broker's template: its own id,
    the static quorum of every node's controller, and replicas on up to three nodes, of which
    all but one must have a write (so one node may be down)."""
    voters = ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in layout.nodes)
    replicas = min(3, layout.brokers)
    min_isr = max(1, replicas - 1)
    return f"""\
node.id={node.node_id}
controller.quorum.voters={voters}
offsets.topic.replication.factor={replicas}
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={min_isr}
share.coordinator.state.topic.replication.factor={replicas}
share.coordinator.state.topic.min.isr={min_isr}
default.replication.factor={replicas}
min.insync.replicas={min_isr}
"""


def render_config(layout: BrokerLayout, node: BrokerNode | None = None) -> str:
    """The ``server.properties`` of ``node`` (the single broker's when None)."""
    node = node or layout.node(1)
    text = (BROKER_SRC / "server.properties.template").read_text()
    if layout.secure:
        text = _with_properties(text, (BROKER_SRC / "secure.properties.template").read_text())
        text = (
            text.replace("@TLS_DIR@", str(layout.tls_dir))
            .replace("@ADMIN_USER@", ADMIN_USER)
            .replace("@ADMIN_PASSWORD@", credentials(layout)[ADMIN_USER])
        )
    if layout.brokers > 1:
        # A static quorum (controller.quorum.voters): storage formatted without --standalone,
        # so the bootstrap-servers form of the single broker goes.
        text = _with_properties(text, cluster_properties(layout, node))
        lines = text.splitlines(keepends=True)
        text = "".join(line for line in lines if not line.startswith("controller.quorum.bootstrap.servers="))
    return (
        text.replace("@LOG_DIR@", str(node.data))
        .replace("@PORT@", str(node.port))
        .replace("@CONTROLLER_PORT@", str(node.controller_port))
        .replace("@HOST@", layout.host)
    )


def write_config(layout: BrokerLayout) -> None:
    """Write every node's ``server.properties``."""
    for node in layout.nodes:
        node.home.mkdir(parents=True, exist_ok=True)
        node.config.write_text(render_config(layout, node))
        if layout.secure:
            node.config.chmod(0o600)  # it holds the admin's password


def _with_properties(base: str, overrides: str) -> str:
    """``base`` with each property ``overrides`` sets replaced in place (or appended)."""

    def key(line: str) -> str | None:
        text = line.strip()
        return text.split("=", 1)[0].strip() if text and not text.startswith("#") and "=" in text else None

    new = {k: line for line in overrides.splitlines() if (k := key(line)) is not None}
    out = [new.get(k, line) if (k := key(line)) is not None else line for line in base.splitlines()]
    replaced = {key(line) for line in base.splitlines()} & set(new)
    out += [line for line in overrides.splitlines() if key(line) not in replaced]
    return "\n".join(out) + "\n"


# -- the secure broker's certificates, users and ACLs ----------------------------------------

#: The SCRAM user the tooling (and the broker itself, between its listeners) connects as.
ADMIN_USER = "admin"


def credentials(layout: BrokerLayout) -> dict[str, str]:
    """Every SCRAM user's password (made once, kept in the broker's home)."""
    from tools.kafka_acls import USERS

    try:
        known: dict[str, str] = json.loads(layout.credentials_file.read_text())
    except FileNotFoundError:
        known = {}
    wanted = {ADMIN_USER, *USERS}
    if not wanted <= set(known):
        known = {**{user: secrets.token_urlsafe(24) for user in sorted(wanted)}, **known}
        layout.home.mkdir(parents=True, exist_ok=True)
        layout.credentials_file.touch(mode=0o600)
        layout.credentials_file.write_text(json.dumps(known, indent=2) + "\n")
    return known


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BrokerError(f"openssl {args[0]} failed:\n{proc.stdout}\n{proc.stderr}")


#: The broker certificate's extensions: valid for the addresses clients and the broker itself dial.
BROKER_CERT_EXTENSIONS = """\
basicConstraints=CA:FALSE
subjectAltName=DNS:localhost,IP:127.0.0.1@EXTRA_SAN@
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
"""


def make_certificates(layout: BrokerLayout) -> None:
    """A CA of this broker's own, and the broker's key and certificate for 127.0.0.1,
    localhost and the broker's own address, signed by it (once), all PEM: ``ca.pem`` is what clients (and the broker, as a
    client of itself) trust; ``broker-keystore.pem`` holds the broker's key and chain.

    openssl, not keytool: each keytool call starts a JVM, nine of them took 13 s on a busy
    machine; Kafka reads PEM key and trust stores as well as PKCS12 ones."""
    tls = layout.tls_dir
    keystore = tls / "broker-keystore.pem"
    if keystore.exists() and layout.ca_file.exists():
        return
    if shutil.which("openssl") is None:
        raise BrokerError("openssl is required to make the secure broker's certificates: install it (apt-get install openssl)")
    _log(f"making a CA and the broker's certificate in {tls}")
    if tls.exists():
        shutil.rmtree(tls)
    tls.mkdir(parents=True)
    tls.chmod(0o700)  # the keys are not encrypted: the folder is what guards them
    ca_key, key, csr, cert = tls / "ca.key", tls / "broker.key", tls / "broker.csr", tls / "broker.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(layout.ca_file),
             "-days", "3650", "-subj", "/CN=statefleet local CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    extensions = tls / "broker.ext"
    extra = f",IP:{layout.host}" if layout.host != "127.0.0.1" else ""
    extensions.write_text(BROKER_CERT_EXTENSIONS.replace("@EXTRA_SAN@", extra))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(layout.ca_file), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "3650", "-extfile", str(extensions))  # fmt: skip
    # Kafka's PEM key store: the (PKCS#8) key, then the chain from the broker's certificate up.
    keystore.write_text(key.read_text() + cert.read_text() + layout.ca_file.read_text())


def client_env(layout: BrokerLayout, user: str = ADMIN_USER) -> dict[str, str]:
    """The settings (``STATEFLEET_`` variables) a client connects to the secure broker with as ``user``."""
    passwords = credentials(layout)
    if user not in passwords:
        raise BrokerError(f"the secure broker has no user {user!r}; its users: {', '.join(sorted(passwords))}")
    return {
        "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": layout.bootstrap,
        "STATEFLEET_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "STATEFLEET_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "STATEFLEET_KAFKA_SASL_USERNAME": user,
        "STATEFLEET_KAFKA_SASL_PASSWORD": passwords[user],
        "STATEFLEET_KAFKA_SSL_CAFILE": str(layout.ca_file),
        # One node. Said, not asked for: reading the brokers' default.replication.factor takes
        # DESCRIBE_CONFIGS on the cluster, which the services' least-privilege ACLs leave out.
        "STATEFLEET_TOPIC_REPLICATION_FACTOR": "1",
    }


def grant(
    layout: BrokerLayout,
    topic_prefix: str = "",
    jobs: Mapping[str, Sequence[str]] | None = None,
    projection: str | None = None,
    domain: str | None = None,
) -> None:
    """Create (or update) every service's and job's SCRAM user, and its ACLs for topics and
    groups named with ``topic_prefix``: the validator's for its ``domain``, the tallies' and the
    backfill's for their ``projection`` (as STATEFLEET_VALIDATOR_DOMAIN and
    STATEFLEET_TALLIES_PROJECTION name them; None: the accounts'), the Spark jobs' for the
    topics their arguments name (``jobs``: each job that runs and its arguments; None: every
    job with the accounts' defaults). Granting what exists already changes nothing."""
    from shared.domain import DomainError
    from shared.projection import ProjectionError
    from tools.kafka_acls import DEFAULT_JOBS, USERS, fleet_acls

    passwords = credentials(layout)
    try:
        acls = fleet_acls(topic_prefix, DEFAULT_JOBS if jobs is None else jobs, projection, domain)
    except (ValueError, ProjectionError, DomainError) as exc:
        raise BrokerError(f"cannot tell the topics to grant: {exc}") from exc
    apply_security(layout, {user: passwords[user] for user in USERS}, acls)
    _log(f"granted {', '.join(USERS)} their ACLs for topic prefix {topic_prefix!r}")


def apply_security(layout: BrokerLayout, users: dict[str, str], acls: Sequence[Acl]) -> None:
    """Create or update the SCRAM ``users`` (name: password) and add ``acls``, as the admin."""
    lines = [f"user {user} {password}" for user, password in users.items()]
    _apply_security_spec(layout, [*lines, *(acl.spec_line() for acl in acls)])


def _apply_security_spec(layout: BrokerLayout, lines: list[str]) -> None:
    """Apply ``lines`` (users and ACLs, see broker/SecuritySetup.java) as the admin."""
    client = layout.home / "admin-client.properties"
    spec = layout.home / "security-spec.txt"
    client.touch(mode=0o600)
    client.write_text(
        "\n".join(
            [
                f"bootstrap.servers={layout.bootstrap}",
                "security.protocol=SASL_SSL",
                "sasl.mechanism=SCRAM-SHA-512",
                "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{ADMIN_USER}" password="{credentials(layout)[ADMIN_USER]}";',
                "ssl.truststore.type=PEM",
                f"ssl.truststore.location={layout.ca_file}",
            ]
        )
        + "\n"
    )
    spec.touch(mode=0o600)
    spec.write_text("\n".join(lines) + "\n")
    cmd = [
        "java",
        "-Xmx256m",
        f"-Dlog4j2.configurationFile={BROKER_SRC / 'log4j2.properties'}",
        "-cp",
        f"{layout.libs}/*",
        str(BROKER_SRC / "SecuritySetup.java"),
        str(client),
        str(spec),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    spec.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise BrokerError(f"applying users and ACLs failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def new_cluster_id() -> str:
    """A random KRaft cluster id: 16 bytes, URL-safe base64 without padding.

    Never starting with "-", which the storage tool would read as an option (Kafka's own
    ``Uuid.randomUuid`` draws again for the same reason).
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def format_storage(layout: BrokerLayout) -> None:
    """Format KRaft storage once per node; an existing ``meta.properties`` means it is done.

    A single broker formats with ``--standalone`` (a new cluster id each time its storage is
    made); the nodes of a cluster with the id kept in ``cluster.json``, all at once."""
    todo = [node for node in layout.nodes if not (node.data / "meta.properties").exists()]
    if not todo:
        return
    if layout.brokers == 1:
        cid = new_cluster_id()
        extra = ["--standalone"]
    else:
        cid = _cluster_id(layout)
        extra = []
    scram: list[str] = []
    if layout.secure:
        # The admin exists from the start: the broker itself connects as it between its listeners.
        scram = ["--add-scram", f"SCRAM-SHA-512=[name={ADMIN_USER},password={credentials(layout)[ADMIN_USER]}]"]
    procs = []
    for node in todo:
        node.data.mkdir(parents=True, exist_ok=True)
        _log(f"formatting KRaft storage in {node.data} (cluster id {cid})")
        cmd = _java_cmd(layout, "kafka.tools.StorageTool", "format", "-t", cid, "-c", str(node.config), *extra, *scram)
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise BrokerError(f"formatting the broker's storage failed:\n{out}")


def _cluster_id(layout: BrokerLayout) -> str:
    """The id every node of the cluster is formatted with (made, and kept, on the first call)."""
    try:
        return str(json.loads(layout.cluster_file.read_text())["cluster_id"])
    except FileNotFoundError:
        # A node formatted already (cluster.json deleted by hand) decides: the others must match it.
        formatted = [_meta_cluster_id(node.data / "meta.properties") for node in layout.nodes]
        cid = next((c for c in formatted if c is not None), None) or new_cluster_id()
        layout.cluster_file.write_text(json.dumps({"brokers": layout.brokers, "cluster_id": cid}) + "\n")
        return cid


def _meta_cluster_id(meta: Path) -> str | None:
    """The cluster id a node's storage was formatted with (its ``meta.properties``), if any."""
    try:
        lines = meta.read_text().splitlines()
    except FileNotFoundError:
        return None
    return next((line.split("=", 1)[1].strip() for line in lines if line.startswith("cluster.id=")), None)


def _check_node_count(layout: BrokerLayout) -> None:
    """Refuse to start a layout with another node count than its storage was formatted with:
    the quorum's voters are fixed at formatting."""
    formatted = formatted_brokers(layout.home)
    single_formatted = (layout.home / "data" / "meta.properties").exists()
    if layout.brokers > 1 and formatted is None and single_formatted and _pid(layout.home / "broker.pid") is not None:
        raise BrokerError(f"the single broker of {layout.home} is running on its ports: stop it first (make down)")
    if formatted is not None and formatted != layout.brokers:
        raise BrokerError(
            f"the cluster in {layout.home} was formatted with {formatted} nodes, not {layout.brokers}: start it with "
            f"BROKERS={formatted} (STATEFLEET_BROKERS), or stop it and delete {layout.cluster_file} and "
            f"{layout.home}/node-* to make a new one"
        )


def reset_storage(layout: BrokerLayout) -> None:
    """Delete every node's log dirs (and a cluster's id): the next start formats anew. The jars stay."""
    for node in layout.nodes:
        shutil.rmtree(node.data, ignore_errors=True)
    layout.cluster_file.unlink(missing_ok=True)


def _pid(node: BrokerNode | BrokerLayout | Path) -> int | None:
    """The pid of the running process a node's (or single broker's) pid file names, if any."""
    pid_file = node if isinstance(node, Path) else node.pid_file
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return None if exited(pid) else pid


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def is_ready(layout: BrokerLayout, timeout: float = 5.0) -> bool:
    """True when every node answers a metadata request that lists every node (not just an
    open port): topics with a replica on each node can then be created."""
    expected = {node.node_id for node in layout.nodes}
    return all(_node_answers(layout, node, expected, timeout) for node in layout.nodes)


def _node_answers(layout: BrokerLayout, node: BrokerNode, expected: set[int], timeout: float = 5.0) -> bool:
    """Whether ``node`` answers a metadata request listing the brokers ``expected`` (a broker
    shows there once it has registered with the controller and caught up with the metadata)."""
    if not port_open(node.port, node.host):
        return False
    try:
        from shared.engine.clients import PlainAdmin  # noqa: F401
    except ImportError:
        return True
    import asyncio

    async def probe() -> bool:
        from shared.engine.clients import PlainAdmin

        connection = {**admin_kwargs(layout), "bootstrap_servers": node.bootstrap}
        admin = PlainAdmin(**connection, request_timeout_ms=int(timeout * 1000))
        try:
            # start() reads the metadata from this node (its bootstrap address) alone.
            await asyncio.wait_for(admin.start(), timeout)
            cluster = await asyncio.wait_for(admin.describe_cluster(), timeout)
            return expected <= {broker["node_id"] for broker in cluster["brokers"]}
        except Exception:
            return False
        finally:
            await admin.close()

    return asyncio.run(probe())


def admin_kwargs(layout: BrokerLayout) -> dict[str, object]:
    """How the tooling's clients reach the broker: as the admin, on the secure one."""
    if not layout.secure:
        return {"bootstrap_servers": layout.bootstrap}
    from shared.engine.clients import client_kwargs
    from shared.settings import Settings

    env = client_env(layout)
    return client_kwargs(
        Settings(
            kafka_bootstrap_servers=env["STATEFLEET_KAFKA_BOOTSTRAP_SERVERS"],
            kafka_security_protocol="SASL_SSL",
            kafka_sasl_mechanism=env["STATEFLEET_KAFKA_SASL_MECHANISM"],
            kafka_sasl_username=env["STATEFLEET_KAFKA_SASL_USERNAME"],
            kafka_sasl_password=env["STATEFLEET_KAFKA_SASL_PASSWORD"],
            kafka_ssl_cafile=env["STATEFLEET_KAFKA_SSL_CAFILE"],
        )
    )


def start(layout: BrokerLayout | None = None, wait_s: float = 90.0) -> BrokerLayout:
    """Start every node that is not running and wait until all answer (idempotent)."""
    layout = layout or default_layout()
    if layout.secure and layout.brokers > 1:
        raise BrokerError("the secure broker runs as a single node: drop --brokers (STATEFLEET_BROKERS) with --secure")
    layout.home.mkdir(parents=True, exist_ok=True)
    # Test workers start the broker they share at the same moment: one formats and starts it,
    # the others find it running.
    with _start_lock(layout):
        return _start_locked(layout, wait_s)


@contextlib.contextmanager
def _start_lock(layout: BrokerLayout) -> Iterator[None]:
    with open(layout.home / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _start_locked(layout: BrokerLayout, wait_s: float) -> BrokerLayout:
    if all(_pid(node) is not None for node in layout.nodes) and is_ready(layout):
        _log(f"already running on {layout.bootstrap} (pid {', '.join(str(_pid(n)) for n in layout.nodes)})")
        return layout
    _check_node_count(layout)
    stopped = [node for node in layout.nodes if _pid(node) is None]
    for node in stopped:
        _check_port_free(layout, node)
    if stopped:
        resolve_jars(layout)
        if layout.secure:
            make_certificates(layout)
        write_config(layout)
        format_storage(layout)
        for node in stopped:
            _spawn(layout, node)
    _wait_ready(layout, layout.nodes, {node.node_id for node in layout.nodes}, wait_s)
    _log(f"ready on {layout.bootstrap}")
    return layout


def _check_port_free(layout: BrokerLayout, node: BrokerNode) -> None:
    for port in (node.port, node.controller_port):
        if port_open(port, node.host):
            variable = "STATEFLEET_SECURE_BROKER_PORT" if layout.secure else "STATEFLEET_BROKER_PORT"
            raise BrokerError(f"port {port} (node {node.node_id}) is taken by another process: stop it or set {variable}")


def _spawn(layout: BrokerLayout, node: BrokerNode) -> None:
    what = "Kafka" if layout.brokers == 1 else f"Kafka node {node.node_id}"
    _log(f"starting {what} on {node.bootstrap}; log: {node.log_file}")
    with open(node.log_file, "ab") as log:
        proc = subprocess.Popen(
            _java_cmd(layout, "kafka.Kafka", str(node.config)),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    node.pid_file.write_text(str(proc.pid))


def _wait_ready(layout: BrokerLayout, nodes: Sequence[BrokerNode], expected: set[int], wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    waiting = list(nodes)
    while time.monotonic() < deadline:
        for node in waiting:
            if _pid(node) is None:
                tail = node.log_file.read_text(errors="replace")[-3000:] if node.log_file.exists() else ""
                raise BrokerError(f"the broker on {node.bootstrap} exited during start-up; last log lines:\n{tail}")
        waiting = [node for node in waiting if not _node_answers(layout, node, expected)]
        if not waiting:
            return
        time.sleep(0.5)
    logs = ", ".join(str(node.log_file) for node in waiting)
    raise BrokerError(f"the broker did not answer on {', '.join(n.bootstrap for n in waiting)} within {wait_s:.0f}s; see {logs}")


def stop(layout: BrokerLayout | None = None, wait_s: float = 60.0) -> None:
    """Stop every node of the layout (all at once: a cluster's last node would otherwise wait
    for a quorum that has gone), and any other node whose pid file is in its home."""
    layout = layout or default_layout()
    pid_files = {node.pid_file for node in layout.nodes}
    pid_files |= {layout.home / "broker.pid", *layout.home.glob("node-*/broker.pid")}
    running = {pid_file: pid for pid_file in sorted(pid_files) if (pid := _pid(pid_file)) is not None}
    if not running:
        _log("not running")
    for pid in running.values():
        _log(f"stopping pid {pid}")
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(_pid(pid_file) is not None for pid_file in running):
        time.sleep(0.2)
    for pid_file, pid in running.items():
        if _pid(pid_file) is not None:
            _log(f"pid {pid} did not stop in time; killing it")
            os.kill(pid, signal.SIGKILL)
    for pid_file in pid_files:
        if pid_file.exists() and _pid(pid_file) is None:
            pid_file.unlink(missing_ok=True)


# -- single nodes of a cluster: what the chaos run and the tests kill and bring back --------------


@dataclass(frozen=True)
class NodeState:
    node_id: int
    port: int
    controller_port: int
    #: The node's process, None when it is not running.
    pid: int | None


def node_states(layout: BrokerLayout) -> dict[int, NodeState]:
    """Every node of the layout by node id: its ports and its pid when running."""
    return {n.node_id: NodeState(n.node_id, n.port, n.controller_port, _pid(n)) for n in layout.nodes}


def kill_node(layout: BrokerLayout, node_id: int, wait_s: float = 60.0) -> int:
    """SIGKILL one node and wait until its process is gone (its ports free); returns its pid."""
    node = layout.node(node_id)
    pid = _pid(node)
    if pid is None:
        raise BrokerError(f"node {node_id} ({node.bootstrap}) is not running: start it first")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while not exited(pid):
        if time.monotonic() > deadline:
            raise BrokerError(f"node {node_id} (pid {pid}) was still exiting {wait_s:.0f}s after SIGKILL")
        time.sleep(0.05)
    _log(f"killed node {node_id} (pid {pid})")
    return pid


def start_node(layout: BrokerLayout, node_id: int, wait_s: float = 90.0) -> int:
    """Start one node again on its storage (if it is not running) and wait until it answers and
    has registered with the controller; returns its pid. The other nodes are left as they are."""
    node = layout.node(node_id)
    with _start_lock(layout):
        if _pid(node) is None:
            _check_port_free(layout, node)
            resolve_jars(layout)
            write_config(layout)
            format_storage(layout)
            _spawn(layout, node)
        _wait_ready(layout, [node], {node_id}, wait_s)
    pid = _pid(node)
    assert pid is not None
    _log(f"node {node_id} answers on {node.bootstrap} (pid {pid})")
    return pid


@dataclass(frozen=True)
class PartitionLeaders:
    #: The leading node of each (topic, partition); -1 while a partition has none.
    leaders: dict[tuple[str, int], int]
    #: The in-sync replicas of each (topic, partition).
    isr: dict[tuple[str, int], tuple[int, ...]]
    #: The node coordinating the consumer group asked about, if one was.
    group_coordinator: int | None = None
    #: The node coordinating the transactional id asked about, if one was.
    transaction_coordinator: int | None = None


async def partition_leaders_async(
    bootstrap: str, topics: Sequence[str], group: str | None = None, transactional_id: str | None = None, timeout_s: float = 30.0
) -> PartitionLeaders:
    """Which node leads each partition of ``topics`` (and its in-sync replicas), and which node
    coordinates ``group`` and ``transactional_id``, from the cluster's metadata. Works with a
    node down: a question sent to it is asked again of another (for up to ``timeout_s``)."""
    from shared.engine.clients import PlainAdmin

    admin = PlainAdmin(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        leaders: dict[tuple[str, int], int] = {}
        isr: dict[tuple[str, int], tuple[int, ...]] = {}
        described = await _retrying(lambda: admin.describe_topics(list(topics)), timeout_s) if topics else []
        for topic in described:
            for partition in topic["partitions"]:
                key = (topic["topic"], partition["partition"])
                leaders[key] = partition["leader"]
                isr[key] = tuple(partition["isr"])
        group_node = txn_node = None
        # The first question about a group or a transactional id creates the internal topic
        # behind it, whose partitions have no leader for a moment.
        if group is not None:
            group_node = int(await _retrying(lambda: admin.find_coordinator(group, 0), timeout_s))
        if transactional_id is not None:
            txn_node = int(await _retrying(lambda: admin.find_coordinator(transactional_id, 1), timeout_s))
        return PartitionLeaders(leaders, isr, group_node, txn_node)
    finally:
        await admin.close()


async def _retrying(call: Callable[[], Awaitable[T]], timeout_s: float) -> T:
    """``call()``, made again after an error that says asking again may help (a node not
    reachable, a coordinator not there yet), until ``timeout_s`` has passed."""
    import asyncio

    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return await call()
        except Exception as exc:  # aiokafka's errors carry whether they are retriable
            if not getattr(exc, "retriable", False) or asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.2)


def partition_leaders(
    layout: BrokerLayout, topics: Sequence[str], group: str | None = None, transactional_id: str | None = None
) -> PartitionLeaders:
    """:func:`partition_leaders_async` on ``layout``'s cluster, from synchronous code."""
    import asyncio

    return asyncio.run(partition_leaders_async(layout.bootstrap, topics, group, transactional_id))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop", "status", "jars", "grant", "env"])
    parser.add_argument("--secure", action="store_true", help="the SASL_SSL broker with ACLs (its own home and port)")
    parser.add_argument(
        "--brokers",
        type=int,
        default=None,
        help="KRaft nodes of the plaintext broker (STATEFLEET_BROKERS; default: as many as its home was formatted with, else 1)",
    )
    parser.add_argument(
        "--topic-prefix",
        default=os.environ.get("STATEFLEET_TOPIC_PREFIX", ""),
        help="with --secure, start and grant: the topic prefix the services' ACLs are for",
    )
    parser.add_argument(
        "--spark-job",
        action="append",
        metavar="'JOB [ARGS]'",
        help="with --secure, start and grant: a Spark job that runs and its arguments, e.g. 'archive_events --topic "
        "order-events' (repeatable; default: every job with the accounts' arguments)",
    )
    parser.add_argument(
        "--projection",
        default=os.environ.get("STATEFLEET_TALLIES_PROJECTION") or None,
        help="with --secure, start and grant: the tallies' projection, and the backfill's when its arguments name none "
        "(STATEFLEET_TALLIES_PROJECTION; default: the accounts tallies)",
    )
    parser.add_argument(
        "--domain",
        default=os.environ.get("STATEFLEET_VALIDATOR_DOMAIN") or None,
        help="with --secure, start and grant: the validator's domain (STATEFLEET_VALIDATOR_DOMAIN; default: the accounts)",
    )
    parser.add_argument("--user", default=ADMIN_USER, help="with --secure, env: the user to print the settings of")
    args = parser.parse_args(argv)
    jobs = None if args.spark_job is None else {job: tuple(rest) for job, *rest in map(shlex.split, args.spark_job)}
    layout = secure_layout() if args.secure else default_layout()
    try:
        if args.brokers is not None:
            if args.brokers < 1:
                raise BrokerError(f"--brokers must be 1 or more, not {args.brokers}")
            layout = dataclasses.replace(layout, brokers=args.brokers)
        if args.action in ("grant", "env") and not layout.secure:
            raise BrokerError(f"{args.action} is for the secure broker: add --secure")
        if args.action == "start":
            start(layout)
            if layout.secure:
                grant(layout, args.topic_prefix, jobs, args.projection, args.domain)
        elif args.action == "grant":
            grant(layout, args.topic_prefix, jobs, args.projection, args.domain)
        elif args.action == "env":
            for name, value in client_env(layout, args.user).items():
                print(f"export {name}={shlex.quote(value)}")
        elif args.action == "stop":
            stop(layout)
        elif args.action == "jars":
            resolve_jars(layout)
        else:
            return _status(layout)
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _status(layout: BrokerLayout) -> int:
    """Print whether the broker (each node of a cluster) runs; 0 when all do, else 1."""
    if layout.brokers == 1:
        running = _pid(layout) is not None and is_ready(layout)
        print(f"broker {'running' if running else 'stopped'} ({layout.bootstrap})")
        return 0 if running else 1
    every = {node.node_id for node in layout.nodes}
    states = node_states(layout)
    up = 0
    for node in layout.nodes:
        pid = states[node.node_id].pid
        # A node answers once it lists itself; with others down it still does.
        answers = pid is not None and _node_answers(layout, node, {node.node_id})
        up += answers
        state = f"running (pid {pid})" if answers else ("starting or stuck" if pid is not None else "stopped")
        print(f"broker node {node.node_id} {state} ({node.bootstrap}, controller {node.host}:{node.controller_port})")
    print(f"cluster of {layout.brokers} nodes: {up} answering; bootstrap {layout.bootstrap}")
    return 0 if up == len(every) else 1


if __name__ == "__main__":
    sys.exit(main())
