"""A worker of its own for engine tests: one stateless handler on ``$PROBE_TOPIC`` that logs
each record it is handed ("probe got …"), and ``GET /readyz`` answered as the services answer it.

Unlike a service it creates no topics before it starts: what happens to an input topic that
is not there yet is what it is for.
"""

from __future__ import annotations

import logging
import os

from fastapi import FastAPI, Response

from shared.engine import Engine, InputBatch
from shared.settings import Settings

PORT = 18999
log = logging.getLogger("probe")


def main() -> None:
    settings = Settings()
    engine = Engine("probe", settings, PORT)

    @engine.handler(os.environ["PROBE_TOPIC"], name="probe", offsets=None)
    async def got(batch: InputBatch) -> None:
        for record in batch.records:
            log.warning("probe got %s[%d] %r", batch.topic, batch.partition, record.value)

    api = FastAPI()

    @api.get("/readyz")
    async def readyz() -> Response:
        return Response(status_code=200 if engine.instance.ready() else 503)

    engine.serve(api)
    engine.run()


if __name__ == "__main__":
    main()
