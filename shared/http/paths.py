"""The ``{name:id}`` path parameter: any id the fleet accepts, as one URL path parameter.

Ids may hold ``/`` and any other character, line breaks included. Starlette's own
``path`` convertor matches ``.*``, which stops at a line break, so an id holding one
would be answered by the router's 404 as if it did not exist. Importing this module
registers the convertor; routes declare ``/tallies/{program_id:id}``.
"""

from __future__ import annotations

from starlette.convertors import Convertor, register_url_convertor


class IdConvertor(Convertor[str]):
    regex = "(?s:.+)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("id", IdConvertor())
