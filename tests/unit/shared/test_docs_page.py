"""/docs works without internet access: everything it loads comes from the service."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from tests.unit.shared.test_openapi import ROUTERS, service_api

URL_IN_HTML = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|\burl\s*:\s*["']([^"']+)["']""")


@pytest.mark.parametrize("service", ROUTERS)
def test_docs_reference_only_local_urls_that_answer(service: str) -> None:
    client = TestClient(service_api(ROUTERS[service]), raise_server_exceptions=False)
    page = client.get("/docs")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    urls = [a or b for a, b in URL_IN_HTML.findall(page.text)]
    assert any(u.endswith("swagger-ui-bundle.js") for u in urls), urls
    assert any(u.endswith(".css") for u in urls), urls
    assert "/openapi.json" in urls
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), f"{url} is not served by the service"
        assert client.get(url).status_code == 200, url
    assert "cdn" not in page.text.lower() and "https://" not in page.text
