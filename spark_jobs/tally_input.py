"""Reading a projection's inputs exactly as the tallies service does.

The service (``services.tallies.handlers.inputs.parse_input``) decodes a record's value with
``shared.codecs.loads_object`` and reads it with the reader its projection gives the
record's topic (:meth:`shared.projection.Projection.reader_for`): a
:class:`~shared.projection.Change` of one entity or a :class:`~shared.projection.Mark` of one
category. Records it rejects go to dead letters and never count; the backfill skips the
same records and reports them. This module runs on Spark's Python workers, so it imports
only pure modules (no Faust).
"""

from __future__ import annotations

from shared import codecs
from shared.projection import Change, InvalidInput, Mark, Projection


def read_input(projection: Projection, topic: str, value: bytes | None, prefix: str = "") -> Change | Mark:
    """A record of ``topic`` (its full name, under ``prefix``) as ``projection`` reads it.

    Raises ``codecs.DecodeError`` or ``InvalidInput`` for a record the service would reject.
    """
    read = projection.reader_for(topic, prefix)
    if read is None:
        raise InvalidInput(f"cannot tell what a record from topic {topic!r} is")
    return read(codecs.loads_object(value))
