"""The console: static assets under /ui, shipped in the package (src/flotilla/data/console).

The assets hold no data and need no token; every figure they show comes from the token-checked /v1 routes.
They are served with a Content-Security-Policy that allows only this origin's scripts and styles, so nothing
injected into a page (an object's name, a decision's reason) can run or send the token elsewhere.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ASSETS = Path(__file__).resolve().parents[1] / "data" / "console"
HEADERS = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; object-src 'none'; "
                                 b"base-uri 'none'; frame-ancestors 'none'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),  # revalidate (ETag) so an upgraded controller serves its own assets
]


class _SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def mount(app: FastAPI) -> None:
    """Serve the console at /ui/ (index.html) and its assets below it."""
    app.mount("/ui", _SecurityHeaders(StaticFiles(directory=ASSETS, html=True)), name="console")

    @app.get("/ui", include_in_schema=False)
    def console_root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=308)
