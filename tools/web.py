"""The tests' and tools' HTTP requests to the services they run, through one client.

``httpx.get`` and its siblings build a client per call, and every client loads the system's CA
certificates into an SSL context of its own: about 50 ms of CPU on these machines, for plain
http too. The tests poll their services several times a second (readiness, tallies, metrics),
so the per-call clients cost a test run minutes of CPU; a benchmark polling its worker's
metrics four times a second lost a fifth of a core to them. These functions take the same
arguments and share one client, which behaves as the per-call ones did:

- it keeps no connection open between requests, so an instance a test kills or restarts on the
  same port never leaves behind a pooled connection for the next request to find closed;
- it stores no cookie, so no request carries what an earlier answer set.

httpx's client may be shared between threads.
"""

from __future__ import annotations

import functools
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx


@functools.cache
def _client() -> httpx.Client:
    no_cookies = CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
    return httpx.Client(cookies=no_cookies, limits=httpx.Limits(max_keepalive_connections=0))


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    return _client().request(method, url, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return _client().get(url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return _client().post(url, **kwargs)


def delete(url: str, **kwargs: Any) -> httpx.Response:
    return _client().delete(url, **kwargs)
