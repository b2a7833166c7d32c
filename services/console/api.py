"""The console's pages: fleet, retries, parked, blocked keys, tallies, accounts and commands, the admin token.

Pages are rendered on the server from the services' answers. Changing actions are
forms posted to the console, which passes them on with the operator's admin token (kept
in a session cookie: entered once per browser session) and renders the service's
answer, refusals included.
"""

from __future__ import annotations

from fastapi import APIRouter

from services.console.pages import accounts, blocked_keys, fleet, messages, parked_groups, token

# One flat router, its routes in the order declared: a path is answered by its first full
# match, as in one module (include_router would nest each part as a router of its own).
router = APIRouter()
for part in (fleet, messages, parked_groups, blocked_keys, accounts, token):
    router.routes.extend(part.router.routes)
