"""Every id the fleet accepts is addressable over HTTP: for each GET of one id, some path
reaches that endpoint with exactly that id, even an id that spells a literal path beside it
(``stats`` beside ``/retries/{id}``)."""

from __future__ import annotations

import re

import pytest
from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.routing import Match

from tests.unit.shared.test_openapi import ROUTERS

#: Ids that look like paths: slashes, a line break, and (added per router) every literal segment it has.
AWKWARD_IDS = ["a/b", "x\ny", "a/replay", "%2F", " "]


def _literal_segments(router: APIRouter) -> set[str]:
    return {s for r in router.routes if isinstance(r, APIRoute) for s in r.path.split("/") if s and "{" not in s}


def _resolve(router: APIRouter, path: str) -> tuple[APIRoute, dict[str, str]] | None:
    """The route of the service's router that answers GET ``path``, as Starlette picks it (the
    first full match, in the order the routes are declared)."""
    scope = {"type": "http", "method": "GET", "path": path, "root_path": "", "query_string": b"", "headers": []}
    for route in router.routes:
        match, child = route.matches(scope)
        if match == Match.FULL:
            return (route, child["path_params"]) if isinstance(route, APIRoute) else None
    return None


def _id_routes(router: APIRouter) -> list[tuple[APIRoute, str]]:
    """GET routes with one ``{name:id}`` parameter, and its name."""
    out = []
    for route in router.routes:
        if not isinstance(route, APIRoute):
            continue
        assert route.methods is not None, "FastAPI gives every route its methods (GET when none are named)"
        if "GET" in route.methods:
            names = re.findall(r"{(\w+):id}", route.path)
            if len(names) == 1:
                out.append((route, names[0]))
    return out


@pytest.mark.parametrize("service", ROUTERS)
def test_every_id_reaches_each_endpoint_that_answers_for_one_id(service: str) -> None:
    router = ROUTERS[service]
    ids = [*AWKWARD_IDS, *sorted(_literal_segments(router))]
    routes = _id_routes(router)
    assert routes
    unreachable = []
    for route, name in routes:
        templates = [r.path for r, n in routes if r.endpoint is route.endpoint and n == name]
        for dlq_id in ids:
            reached = [
                resolved
                for template in templates
                if (resolved := _resolve(router, template.replace(f"{{{name}:id}}", dlq_id))) is not None
                and resolved[0].endpoint is route.endpoint
                and resolved[1].get(name) == dlq_id
            ]
            if not reached:
                unreachable.append(f"{route.path} with {name}={dlq_id!r}")
    assert unreachable == []


def test_retries_stats_still_answers_the_stats() -> None:
    resolved = _resolve(ROUTERS["retry_scheduler"], "/retries/stats")
    assert resolved is not None and resolved[0].name == "retry_stats"
