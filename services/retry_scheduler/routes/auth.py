"""Who calls the retry scheduler's API: the named token an ``Authorization: Bearer`` header
carries (services/retry_scheduler/tokens.py), and what it may do with a message of an origin topic.

- A changing call needs a valid token (401 otherwise) whose ``act`` scope covers the origin
  topic of the message, group or key it acts on (403 otherwise, naming the token, the topic
  and the scope); its name is the actor recorded in the message's history.
- With ``STATEFLEET_PAYLOADS_REQUIRE_TOKEN``, a read that answers a message's key, value and
  headers needs a token whose ``read`` scope covers its origin topic (401 without a valid one,
  403 with one that does not cover it); lists answer every message, without the key and
  headers of those the caller's token does not cover (``payload_hidden``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.retry_scheduler.entries import Entry
from services.retry_scheduler.models import entry_json
from services.retry_scheduler.tokens import ACT, READ, Scope, Token, TokenBook
from shared.http.deps import Ctx
from shared.http.errors import Forbidden, Unauthorized

#: The security scheme of the OpenAPI document: a bearer token (auto_error off: the 401 is ours, in the shared error body).
BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="A token of the retry scheduler: the admin token (STATEFLEET_ADMIN_TOKEN) or a named one of "
    "STATEFLEET_TOKENS_FILE, with its origin topics and scopes (read, act, admin). Changing calls need one with act; "
    "with STATEFLEET_PAYLOADS_REQUIRE_TOKEN, reads of a message's payload need one with read.",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]

#: For operations whose token is optional (payload reads): OpenAPI's "no token, or a bearer token".
OPTIONAL_BEARER: dict[str, Any] = {"security": [{}]}  # FastAPI adds {"bearer": []} before it


def token_book(ctx: Any) -> TokenBook:
    book: TokenBook = ctx.extras["service"].tokens
    return book


def _token_of(ctx: Any, credentials: HTTPAuthorizationCredentials | None, needed: str, scope: Scope) -> Token:
    """The valid token ``credentials`` carry; 401, saying the ``scope`` needed, without one."""
    token = None if credentials is None else token_book(ctx).find(credentials.credentials.strip())
    if token is None:
        given = "the bearer token is not valid" if credentials is not None else "no bearer token was given"
        exc = Unauthorized(f"{needed} needs 'Authorization: Bearer <token>' of a token with the {scope} scope: {given}")
        exc.extra["scope"] = scope
        raise exc
    return token


async def acting_token(ctx: Ctx, credentials: Credentials) -> Token:
    """The valid token of a changing call (401 without one); what it may act on is checked with :func:`allow`."""
    return _token_of(ctx, credentials, "a changing call", ACT)


async def reading_token(ctx: Ctx, credentials: Credentials) -> Token | None:
    """The token of a read of payloads: None when payloads are open (any token is then ignored); with
    STATEFLEET_PAYLOADS_REQUIRE_TOKEN, a valid one (401 without)."""
    if not ctx.settings.payloads_require_token:
        return None
    return _token_of(
        ctx, credentials, "reading a message's key, value and headers (STATEFLEET_PAYLOADS_REQUIRE_TOKEN is on)", READ
    )


async def listing_token(ctx: Ctx, credentials: Credentials) -> Token | None:
    """The token of a list: None without one (the list then leaves out the payloads it must); 401 for one that is not valid."""
    if credentials is None or not ctx.settings.payloads_require_token:
        return None
    return _token_of(ctx, credentials, "a list showing payloads", READ)


Acting = Annotated[Token, Depends(acting_token)]
Reading = Annotated[Token | None, Depends(reading_token)]
Listing = Annotated[Token | None, Depends(listing_token)]


def allow(ctx: Any, token: Token, scope: Scope, topic: str) -> None:
    """403, naming the token, the topic and the scope, unless ``token`` may ``scope`` on messages of ``topic``."""
    if token.may(scope, topic, ctx.settings.topic_prefix):
        return
    if not token.has(scope):
        why = f"it has no {scope} scope (its scopes: {', '.join(sorted(token.scopes))})"
    else:
        why = f"its topics ({', '.join(token.topics)}) do not cover {topic!r}"
    verb = "read the payload of" if scope == READ else "act on"
    exc = Forbidden(
        f"token {token.name!r} may not {verb} messages of origin topic {topic!r}: {why}; it needs the {scope} scope on it"
    )
    exc.extra.update({"token": token.name, "topic": topic, "scope": scope})
    raise exc


def may_read(ctx: Any, token: Token | None, topic: str) -> bool:
    """Whether a list shows the key and headers of a message of ``topic`` to the caller."""
    if not ctx.settings.payloads_require_token:
        return True
    return token is not None and token.may(READ, topic, ctx.settings.topic_prefix)


def listed_entry(ctx: Any, token: Token | None, e: Entry) -> dict[str, Any]:
    """A stored entry as a list shows it to the caller of ``token``: without its key and headers
    when payloads need a token and that token does not cover its origin topic with read."""
    out = entry_json(e)
    if not may_read(ctx, token, e.origin_topic):
        out.update(key=None, key_base64=None, headers={}, payload_hidden=True)
    return out


__all__ = ["ACT", "READ", "Acting", "Listing", "Reading", "allow", "listed_entry", "may_read"]
