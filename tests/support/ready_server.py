"""A stand-in service for testing the fleet tool: answers 200 to every GET on
``STATEFLEET_HTTP_PORT`` until it is killed."""

from __future__ import annotations

import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"status":"ready"}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(os.environ["STATEFLEET_HTTP_PORT"])), Ready).serve_forever()
