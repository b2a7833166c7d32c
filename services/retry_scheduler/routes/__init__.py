"""HTTP: scheduled and parked messages, from any instance.

Point queries and commands go to the instance that owns the id's partition (the id
says which: the scheduler keys everything by ``dlq.id``); lists and stats are gathered
from every instance. Commands (replay, cancel, replay a parked message) need the admin
bearer token and are applied by the partition's inbox handler, in order with its other
work; the answer comes once the handler has applied them. A group action (every parked message of
an origin topic and error class) is applied by each instance to the partitions it owns,
through the same inbox, and the answers are summed.
"""

from __future__ import annotations

from fastapi import APIRouter

from services.retry_scheduler.routes import ordered, parked, scheduled

# One flat router, its routes in the order declared: a path is answered by its first full
# match, as in one module (include_router would nest each part as a router of its own).
router = APIRouter()
for part in (scheduled, parked, ordered):
    router.routes.extend(part.router.routes)
