"""Calls to the services' public HTTP APIs, from any of their configured base URLs.

Each service is reached through one or more base URLs (an instance each, or a
Kubernetes client Service). A base URL that cannot be connected to is skipped for the
next one; any answer, success or refusal, is final. A refusal becomes an
:class:`UpstreamError` carrying the status and the service's own error detail, so the
page can show it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import orjson


class UpstreamError(Exception):
    """A service refused a call (``status``) or did not answer (``status`` None)."""

    def __init__(self, service: str, status: int | None, detail: str, url: str) -> None:
        super().__init__(detail)
        self.service = service
        self.status = status
        self.detail = detail
        self.url = url

    def __str__(self) -> str:
        if self.status is None:
            return f"{self.service} did not answer ({self.url}): {self.detail}"
        return f"{self.service} answered {self.status}: {self.detail}"


def path_id(value: str) -> str:
    """An id as one path segment (slashes and all)."""
    return quote(value, safe="")


def _detail(resp: httpx.Response) -> str:
    """The service's ``{"error", "detail"}`` body as one line, or the raw text."""
    try:
        body = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        return resp.text.strip()[:500] or resp.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        if isinstance(detail, list):  # validation errors
            detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg', '')}" for d in detail)
        code = body.get("error")
        return f"{code}: {detail}" if code and code != detail else str(detail)
    return resp.text.strip()[:500]


@dataclass
class Answer:
    status: int
    body: Any


class ServiceClient:
    """One service's API through its base URLs (none: the service is not deployed)."""

    def __init__(self, name: str, label: str, base_urls: list[str], http: httpx.AsyncClient) -> None:
        self.name = name
        self.label = label
        self.base_urls = [u.rstrip("/") for u in base_urls]
        self.http = http
        self._preferred = 0

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        token: str | None = None,
        base_url: str | None = None,
        wait_s: float | None = None,
    ) -> Answer:
        """The service's answer; raises UpstreamError unless it is 2xx."""
        if not self.base_urls and not base_url:
            raise UpstreamError(self.label, None, "not deployed with this console (no base URL configured)", "")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        query = {k: v for k, v in (params or {}).items() if v is not None and v != ""}
        bases = [base_url] if base_url else self.base_urls[self._preferred :] + self.base_urls[: self._preferred]
        last: UpstreamError | None = None
        for base in bases:
            url = base + path
            try:
                resp = await self.http.request(
                    method, url, params=query, headers=headers, timeout=wait_s if wait_s is not None else httpx.USE_CLIENT_DEFAULT
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                last = UpstreamError(self.label, None, str(exc) or type(exc).__name__, url)
                continue  # nothing was sent: the next base URL may answer
            except httpx.HTTPError as exc:
                raise UpstreamError(self.label, None, str(exc) or type(exc).__name__, url) from exc
            if base_url is None:
                self._preferred = self.base_urls.index(base)
            if resp.status_code >= 300:
                raise UpstreamError(self.label, resp.status_code, _detail(resp), url)
            content_type = resp.headers.get("content-type", "")
            body: Any = orjson.loads(resp.content) if "json" in content_type and resp.content else resp.text
            return Answer(resp.status_code, body)
        assert last is not None
        raise last

    async def get(self, path: str, **kwargs: Any) -> Any:
        return (await self.call("GET", path, **kwargs)).body

    async def get_or_none(self, path: str, **kwargs: Any) -> Any:
        """The body, or None on 404."""
        try:
            return await self.get(path, **kwargs)
        except UpstreamError as exc:
            if exc.status == 404:
                return None
            raise


@dataclass
class Clients:
    validator: ServiceClient
    tallies: ServiceClient
    retry_scheduler: ServiceClient

    def all(self) -> list[ServiceClient]:
        return [self.validator, self.tallies, self.retry_scheduler]

    def deployed(self) -> list[ServiceClient]:
        return [c for c in self.all() if c.base_urls]


def split_urls(value: str) -> list[str]:
    return [u.strip() for u in value.split(",") if u.strip()]
