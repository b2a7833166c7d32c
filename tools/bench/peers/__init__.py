"""The peers benchmark: the same tally work in statefleet, Kafka Streams and Quix Streams
(``python -m tools.bench peers``); the method is in :mod:`tools.bench.peers.runner`."""

from tools.bench.peers.runner import main

__all__ = ["main"]
