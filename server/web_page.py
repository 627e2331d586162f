"""The web page at `GET /` (issue 23): type a text, pick a voice and a format, hear it while it streams.

The page is three static files in `server/web/` (package data, so they are in the wheel), served from here: no build
step, nothing from a CDN. They use relative URLs only, so the page also works behind a proxy that serves the app
under a path prefix (open it with the trailing slash: `https://host/prefix/`). The page talks to the public API like
any client (`/v1/models`, `/v1/audio/voices`, a streamed `POST /v1/audio/speech`), so it needs no route of its own.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

PAGE_DIR = Path(str(resources.files("server") / "web"))
ASSETS = "/web"
# Everything from this server; `blob:` for the audio played through MediaSource or once complete, `data:` for the
# empty favicon (so a browser does not ask for /favicon.ico). No inline script or style, so a text that reached the
# page's DOM could not run anything.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; media-src 'self' blob:; "
       "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
# no-cache: a browser revalidates (an ETag round trip) instead of keeping an old app.js after an upgrade
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}


class _PageFiles(StaticFiles):
    """The page's scripts and stylesheet, revalidated on every load (see HEADERS)."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update({"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})
        return response


def add_page(app: FastAPI) -> None:
    """`GET /` (the page) and `/web/*` (its files). Outside `/v1`: the page itself needs no API key; the requests it
    makes send the one typed into it."""
    app.mount(ASSETS, _PageFiles(directory=PAGE_DIR), name="web")
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def page() -> FileResponse:
        return FileResponse(PAGE_DIR / "index.html", media_type="text/html; charset=utf-8", headers=HEADERS)

    app.include_router(router)
