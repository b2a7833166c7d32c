"""Send what an agent cannot process to ``dead-letters`` with the contract's headers."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

import faust

from shared.dead_letters import DeadLetter, dead_letter_for
from shared.metrics import DEAD_LETTERS_WRITTEN

log = logging.getLogger(__name__)


class DeadLetterSink:
    def __init__(self, app: faust.App, service: str, dead_letter_topic: str, retry_topic: str) -> None:
        self.app = app
        self.service = service
        self.dead_letter_topic = dead_letter_topic
        self.retry_topic = retry_topic

    def letter_for(self, event: Any, error: BaseException) -> DeadLetter:
        msg = event.message
        return dead_letter_for(
            msg.key, msg.value, msg.headers,
            topic=msg.topic, partition=msg.partition, offset=msg.offset,
            error=error, retry_topic=self.retry_topic,
        )

    async def send(self, event: Any, error: BaseException) -> DeadLetter:
        """Dead-letter ``event``; returns once the send is queued (acked with the next flush)."""
        letter, _ = await self.send_pending(event, error)
        return letter

    async def send_pending(self, event: Any, error: BaseException) -> tuple[DeadLetter, Awaitable[Any]]:
        """Dead-letter ``event``; returns once the send is queued, with the future of its acknowledgement."""
        letter = self.letter_for(event, error)
        log.warning(
            "dead-lettering %s[%s]@%s (dlq.id=%s attempt=%s): %s: %s",
            event.message.topic, event.message.partition, event.message.offset,
            letter.id, letter.attempt, letter.error_class, letter.error_message,
        )
        ack: Awaitable[Any] = await self.app.producer.send(
            self.dead_letter_topic, letter.key, letter.value, partition=None, timestamp=None,
            headers=letter.headers(),
        )
        DEAD_LETTERS_WRITTEN.labels(self.service, letter.error_class).inc()
        return letter, ack
