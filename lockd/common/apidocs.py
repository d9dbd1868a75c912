"""``GET /docs``: Swagger UI over the server's own ``/openapi.json``, with no CDN.

FastAPI's default ``/docs`` page loads Swagger UI's script and style from a CDN, so it is blank
on a machine without internet access. Here the page and its three assets are served by the
server itself, from the files the ``fastapi-offline`` package ships (Swagger UI 5, which renders
the OpenAPI 3.1 both servers emit). ``DOCS_PATHS`` are the exact paths ``install_docs`` adds:
a server with API keys keeps them open (they describe the API, they hold no data).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from starlette.routing import Route

__all__ = ["ASSETS", "DOCS_PATHS", "install_docs"]

ASSETS = Path(str(files("fastapi_offline") / "static"))
"""The directory holding ``swagger-ui-bundle.js``, ``swagger-ui.css`` and ``favicon.png``."""

_FILES = {"swagger-ui-bundle.js": "text/javascript; charset=utf-8",
          "swagger-ui.css": "text/css; charset=utf-8",
          "favicon.png": "image/png"}

DOCS_PATHS = frozenset({"/docs", *(f"/docs/{name}" for name in _FILES)})


def install_docs(app: FastAPI, *, title: str) -> None:
    """Add ``/docs`` (Swagger UI titled ``title``) and its assets under ``/docs/`` to ``app``;
    none of them appear in the OpenAPI document. The app must have ``docs_url=None``."""

    async def page(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}/openapi.json", title=f"{title} - API",
            swagger_js_url=f"{root}/docs/swagger-ui-bundle.js",
            swagger_css_url=f"{root}/docs/swagger-ui.css",
            swagger_favicon_url=f"{root}/docs/favicon.png",
            # no badge from validator.swagger.io: the page asks nothing of other hosts
            swagger_ui_parameters={"validatorUrl": None})

    def asset(name: str, media_type: str) -> Route:
        path = ASSETS / name

        async def serve(request: Request) -> FileResponse:
            return FileResponse(path, media_type=media_type,
                                headers={"Cache-Control": "public, max-age=86400"})

        return Route(f"/docs/{name}", serve, methods=["GET", "HEAD"], include_in_schema=False)

    app.router.routes.append(Route("/docs", page, methods=["GET", "HEAD"],
                                   include_in_schema=False))
    app.router.routes.extend(asset(name, media) for name, media in _FILES.items())
