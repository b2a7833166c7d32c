"""Why the brokers refuse this worker, said at start-up: wrong credentials, an untrusted
certificate, or an ACL its user lacks.

aiokafka hides each of these behind something else: a failed SASL handshake or TLS check on
bootstrap is logged and then raised as "Unable to bootstrap", the same error as a broker not
up yet (which :func:`~shared.engine._clients.started_when_reachable` rightly waits out); a topic
the user may not see is just absent from the metadata; a refused topic creation is an error code
in a response nobody reads. Left so, a worker waits forever or crashes later on an error that
names no setting. Here the refusal is found and raised as :class:`BrokerAccessDenied`, whose
message says what is wrong and what to change; the worker exits with it (shared/runtime.py).
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnsupportedSaslMechanismError,
    for_code,
)
from aiokafka.protocol.group import HeartbeatRequest

from shared.settings import Settings

log = logging.getLogger(__name__)

#: How long one diagnostic connection may take.
PROBE_TIMEOUT_MS = 10_000


class BrokerAccessDenied(RuntimeError):
    """The brokers refuse this client for a reason waiting will not fix; the message says what
    is wrong and what to do."""


def who(settings: Settings) -> str:
    if settings.kafka_security_protocol.startswith("SASL"):
        return f"user {settings.kafka_sasl_username!r}"
    return "this client (no SASL user)"


async def refusal(settings: Settings, conn_kwargs: dict[str, Any]) -> BrokerAccessDenied | None:
    """Why the bootstrap servers refuse a connection made with ``conn_kwargs`` (a client's
    keyword arguments), when it is not just that none answers yet: then None."""
    for address in (a.strip() for a in settings.kafka_bootstrap_servers.split(",") if a.strip()):
        host, _, port = address.rpartition(":")
        try:
            conn = await create_conn(
                host,
                int(port),
                request_timeout_ms=PROBE_TIMEOUT_MS,
                ssl_context=conn_kwargs.get("ssl_context"),
                security_protocol=conn_kwargs.get("security_protocol", "PLAINTEXT"),
                sasl_mechanism=conn_kwargs.get("sasl_mechanism"),
                sasl_plain_username=conn_kwargs.get("sasl_plain_username"),
                sasl_plain_password=conn_kwargs.get("sasl_plain_password"),
            )
        except (SaslAuthenticationFailed, AuthenticationFailedError) as exc:
            return BrokerAccessDenied(
                f"SASL authentication failed for {who(settings)} ({settings.kafka_sasl_mechanism}) at {address}: {exc}. "
                "Check STATEFLEET_KAFKA_SASL_USERNAME and STATEFLEET_KAFKA_SASL_PASSWORD (and that the user exists "
                "on the brokers with that mechanism)"
            )
        except UnsupportedSaslMechanismError as exc:
            return BrokerAccessDenied(f"{address} refuses the SASL mechanism: {exc}. Set STATEFLEET_KAFKA_SASL_MECHANISM")
        except ssl.SSLCertVerificationError as exc:
            return BrokerAccessDenied(
                f"the TLS certificate of {address} is not trusted: {exc.verify_message or exc}. Set "
                "STATEFLEET_KAFKA_SSL_CAFILE to the CA that signed the brokers' certificates"
            )
        except ssl.SSLError as exc:
            return BrokerAccessDenied(
                f"TLS with {address} failed: {exc}. Check STATEFLEET_KAFKA_SECURITY_PROTOCOL (does the listener "
                "speak TLS?) and the STATEFLEET_KAFKA_SSL_* settings"
            )
        except (OSError, KafkaError, TimeoutError):
            continue  # not answering: a reason to wait, not to give up
        conn.close()
    return None


def grant_hint(settings: Settings, resource: str, operations: str) -> str:
    return _grant(settings.kafka_sasl_username, resource, operations)


def _grant(user: str | None, resource: str, operations: str) -> str:
    principal = f"User:{user}" if user else "this client's principal"
    return f"grant {principal} {operations} on {resource} (docs/security.md lists each service's ACLs)"


#: Starts the note :func:`explain_denial` adds to the exception it explains.
DENIAL_NOTE = "what to grant: "


def explain_denial(exc: BaseException, user: str | None, app_id: str, *, reading: bool) -> str | None:
    """What to grant, when ``exc`` is the brokers refusing a running worker for want of an ACL
    (one revoked since the start-up checks, or one they cannot check: writing a topic, reading
    one the user may only see); ``reading``: it came out of a fetch, not a send. Else None, and
    None too for an exception explained already (a failed batch goes on up the fetch loop).
    The explanation is added to the exception as a note, so its traceback says it as well."""
    if any(note.startswith(DENIAL_NOTE) for note in getattr(exc, "__notes__", ())):
        return None
    denial = _denial(exc, user, app_id, reading=reading)
    if denial is not None:
        exc.add_note(DENIAL_NOTE + denial)
    return denial


def _denial(exc: BaseException, user: str | None, app_id: str, *, reading: bool) -> str | None:
    as_user = f"user {user!r}" if user else "this client"
    if isinstance(exc, TopicAuthorizationFailedError):
        topics = exc.args[0] if exc.args else "?"
        names = topics if isinstance(topics, str) else ", ".join(sorted(topics))
        operation = "READ" if reading else "WRITE"
        return f"{as_user} is not authorized to {operation} topic {names}: " + _grant(user, f"topic {names}", operation)
    if isinstance(exc, GroupAuthorizationFailedError):
        return f"{as_user} is not authorized to use consumer group {app_id}: " + _grant(
            user, f"group {app_id}", "READ and DESCRIBE"
        )
    if isinstance(exc, TransactionalIdAuthorizationFailed):
        return f"{as_user} is not authorized to use its transactional ids ({app_id}.*, exactly_once): " + _grant(
            user, f"transactional ids with the prefix {app_id}.", "WRITE and DESCRIBE"
        )
    if isinstance(exc, ClusterAuthorizationFailedError):
        return f"{as_user} is not authorized to write idempotently: " + _grant(user, "the cluster", "IDEMPOTENT_WRITE")
    return None


def check_created(settings: Settings, response: Any) -> list[str]:
    """Raise :class:`BrokerAccessDenied` naming the topics the CreateTopics ``response`` refused
    for lack of an ACL; else the topics it found existing already (see :func:`check_visible`)."""
    refused = [entry[0] for entry in response.topic_errors if entry[1] and for_code(entry[1]) is TopicAuthorizationFailedError]
    if refused:
        names = ", ".join(refused)
        raise BrokerAccessDenied(
            f"{who(settings)} is not authorized to see or create topic{'s' if len(refused) > 1 else ''} {names}: "
            + grant_hint(settings, names, "DESCRIBE and CREATE (or create them as an administrator)")
        )
    return [entry[0] for entry in response.topic_errors if entry[1] and for_code(entry[1]) is TopicAlreadyExistsError]


async def check_group(settings: Settings, admin: Any, group: str) -> None:
    """Raise :class:`BrokerAccessDenied` unless this client may join consumer group ``group``.

    Finding its coordinator takes DESCRIBE on the group; a heartbeat of no member takes READ
    (the broker checks it before it looks for the member), which joining takes too."""
    hint = grant_hint(settings, f"group {group}", "READ and DESCRIBE")
    try:
        coordinator = await admin.find_coordinator(group)
        response = await admin.send_to_broker(HeartbeatRequest(group, -1, ""), coordinator)
    except GroupAuthorizationFailedError:
        raise BrokerAccessDenied(f"{who(settings)} is not authorized to describe consumer group {group!r}: {hint}") from None
    except (KafkaError, TimeoutError) as exc:
        # No coordinator yet (a new cluster creates its offsets topic now), say: the consumer
        # waits for one anyway, and a refusal would show there.
        log.info("could not check access to consumer group %s now (%r); going on", group, exc)
        return
    if for_code(response.error_code) is GroupAuthorizationFailedError:
        raise BrokerAccessDenied(f"{who(settings)} is not authorized to join consumer group {group!r}: {hint}")


def check_visible(settings: Settings, described: list[dict[str, Any]]) -> None:
    """Raise :class:`BrokerAccessDenied` naming the topics whose metadata (``described``: topics
    that exist, their creation said so) the brokers refuse this client for want of an ACL.
    Asked by name, a topic not visible for want of time (just created elsewhere) is
    "unknown", not "unauthorized"."""
    hidden = [d["topic"] for d in described if d["error_code"] and for_code(d["error_code"]) is TopicAuthorizationFailedError]
    if hidden:
        names = ", ".join(hidden)
        raise BrokerAccessDenied(
            f"{who(settings)} is not authorized to describe topic{'s' if len(hidden) > 1 else ''} {names}: "
            + grant_hint(settings, names, "what the service does with each (READ or WRITE)")
        )
