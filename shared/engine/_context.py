"""What the engine's parts need of one app besides the app itself.

Faust builds some of the engine's objects from the app alone (its table manager and recovery
service, its consumer), and the instance's views read the running worker through it. What
they need beyond Faust's own (the settings, the service's name, the copies' changelog ends,
the peer watch) is one :class:`AppContext`, set on the app as it is created
(:func:`shared.engine._app.create_app`) and filled in by the engine: not registries keyed by
the app, and nothing an app of another engine could see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.settings import Settings

if TYPE_CHECKING:
    from shared.engine._copies import ChangelogEnds
    from shared.engine._membership import PeerWatch


@dataclass
class AppContext:
    settings: Settings
    #: The service the app runs (the ``service`` label of its metrics).
    service: str
    #: The changelog ends and incarnations this instance's copies are measured against.
    copies: ChangelogEnds | None = None
    #: Probes the peers, when the engine keeps a peer watch.
    peer_watch: PeerWatch | None = None


def context_of(app: object) -> AppContext | None:
    """The context set on ``app`` (None for an app the engine did not create)."""
    context = getattr(app, "engine_context", None)
    return context if isinstance(context, AppContext) else None
