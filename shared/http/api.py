"""The FastAPI app every service starts from."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from shared.http.context import ServiceContext
from shared.http.errors import ERROR_DESCRIPTIONS, ErrorOut, install_error_handlers
from shared.http.forwarding import LAG, MAX_LAG_PARAM, SERVED_BY, SOURCE, AnsweredElsewhere
from shared.http.health import router as health_router
from shared.http.instance import router as instance_router
from shared.http.limits import BodySizeLimit
from shared.http.middleware import PlainQueryValues, ServedBy


def create_api(ctx: ServiceContext, *, title: str, description: str, version: str = "1.0.0") -> FastAPI:
    # /docs is served below from assets installed with the service, not from a CDN, so it
    # works without internet access; ReDoc has no such assets and is not offered.
    api = FastAPI(title=title, description=description, version=version, docs_url=None, redoc_url=None)
    api.state.ctx = ctx
    install_error_handlers(api)

    @api.exception_handler(AnsweredElsewhere)
    async def answered_elsewhere(_: Request, answer: AnsweredElsewhere) -> Response:
        return answer.response

    # Outermost last: every answer, the refusals of the two inner ones included, names its instance.
    api.add_middleware(BodySizeLimit, max_bytes=ctx.settings.max_body_bytes)
    api.add_middleware(PlainQueryValues)
    api.add_middleware(ServedBy, ctx=ctx)
    api.include_router(health_router)
    api.include_router(instance_router)
    _document_errors(api)
    _serve_docs(api, title)
    return api


DOCS_ASSETS = "/docs/assets"


def _serve_docs(api: FastAPI, title: str) -> None:
    """Swagger UI at /docs, with its scripts, styles and icon served by the service itself."""
    api.mount(DOCS_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @api.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=f"{root}{api.openapi_url}",
            title=f"{title} - API docs",
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon-32x32.png",
            oauth2_redirect_url=f"{root}/docs/oauth2-redirect",
        )

    @api.get("/docs/oauth2-redirect", include_in_schema=False)
    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()


_ERROR_REF = {"$ref": "#/components/schemas/ErrorOut"}


def _error_response(status: int) -> dict[str, Any]:
    return {"description": ERROR_DESCRIPTIONS[status], "content": {"application/json": {"schema": _ERROR_REF}}}


#: Headers of every answer read from state (docs/contract.md, "Availability").
READ_FROM_STATE_HEADERS: dict[str, Any] = {
    SOURCE: {
        "description": "Which copy of the key's partition answered: active (its owner, processing), standby (a "
        "standby or a previous owner's copy) or restoring",
        "schema": {"type": "string", "enum": ["active", "standby", "restoring"]},
    },
    LAG: {
        "description": "Changelog records that copy had not applied, against the partition's changelog end as last known",
        "schema": {"type": "integer", "minimum": 0},
    },
    SERVED_BY: {"description": "URL of the instance whose state answered", "schema": {"type": "string"}},
}


def _document_read_from_state(responses: dict[str, Any]) -> None:
    for status, response in responses.items():
        if status in ("200", "404"):
            response.setdefault("headers", {}).update(READ_FROM_STATE_HEADERS)
    if "503" in responses:
        responses["503"]["description"] = (
            f"{responses['503'].get('description', '')}. With ?max_lag: every copy that could answer is further "
            "behind than that; the body's lag says by how much"
        ).lstrip(". ")
    else:
        responses["503"] = _error_response(503)


def _document_errors(api: FastAPI) -> None:
    """Make /openapi.json tell the errors every operation can answer, as they are sent.

    FastAPI documents 422 with a body shape of its own, while the error handlers
    answer ``ErrorOut`` for it; and it knows nothing of what happens before a handler:
    a body that cannot be parsed (400) or is too large (413).
    """
    generate = api.openapi

    def openapi() -> dict[str, Any]:
        if api.openapi_schema:
            return api.openapi_schema
        schema = generate()
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas.setdefault("ErrorOut", ErrorOut.model_json_schema(ref_template="#/components/schemas/{model}"))
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                if "422" in responses:
                    responses["422"] = _error_response(422)
                if "requestBody" in operation:
                    responses.setdefault("400", _error_response(400))
                    responses.setdefault("413", _error_response(413))
                if any(p.get("name") == MAX_LAG_PARAM for p in operation.get("parameters", ())):
                    _document_read_from_state(responses)
        for unused in ("HTTPValidationError", "ValidationError"):
            if unused not in str(schema.get("paths")):
                schemas.pop(unused, None)
        api.openapi_schema = schema
        return schema

    api.openapi = openapi  # type: ignore[method-assign]
