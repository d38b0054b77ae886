"""The labelling web app: a small JSON API and a static page (``static/``).

API (all POST bodies are JSON; errors are ``{"error": "one line"}`` with a 4xx status):

=======================  ==========================================  ============================
route                    body                                        answer
=======================  ==========================================  ============================
GET  /                   -                                           the labelling page
GET  /static/{name}      -                                           app.js, style.css
GET  /api/health         -                                           {"ok": true}
POST /api/labellers      {"labeller"}                                progress (registers name)
POST /api/next           {"labeller"}                                {"pair": {pair_id, prompt,
                                                                     left, right} | null, ...}
POST /api/votes          {"labeller", "pair_id", "choice": 1..5,     201 stored, 200 replay
                         "request_id"}
POST /api/skip           {"labeller", "pair_id"}                     200
POST /api/undo           {"labeller"}                                {"undone": pair_id | null}
=======================  ==========================================  ============================

``choice`` is in the frame the labeller saw (1 = left significantly better ... 5 = right
significantly better); the server, which stored the left/right order when it handed out the
pair, converts it to the canonical A/B score. Model names never reach the browser.
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlhfkit.label.pairs import PAIR_ID_RE
from rlhfkit.label.security import make_middleware
from rlhfkit.label.store import LabelError, LabelStore

STATIC_TYPES = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
NAME_PUNCTUATION = set(" ._-@'")


def _check_name(name: str) -> str:
    if not all(ch.isalnum() or ch in NAME_PUNCTUATION for ch in name):
        raise ValueError("labeller name may contain letters, digits, spaces and . _ - @ ' only")
    return name


LabellerName = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=40), AfterValidator(_check_name)
]
PairId = Annotated[str, StringConstraints(max_length=128, pattern=PAIR_ID_RE.pattern)]
RequestId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{8,64}$")]
Choice = Annotated[int, Field(strict=True, ge=1, le=5)]


class LabellerBody(BaseModel):
    """Identifies the labeller (their name is their identity)."""

    model_config = ConfigDict(extra="forbid")
    labeller: LabellerName


class SkipBody(LabellerBody):
    pair_id: PairId


class VoteBody(SkipBody):
    choice: Choice
    request_id: RequestId = Field(description="client-made id; a replay with the same id is stored once")


def _static(name: str) -> bytes:
    return resources.files("rlhfkit.label").joinpath("static", name).read_bytes()


def _validation_message(exc: RequestValidationError) -> str:
    """One readable line from pydantic's error list, e.g. 'choice: Input should be ... 5'."""
    parts = []
    for err in exc.errors()[:3]:
        if err.get("type") == "json_invalid":
            detail = (err.get("ctx") or {}).get("error", "")
            parts.append(f"body: invalid JSON ({detail})" if detail else "body: invalid JSON")
            continue
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def create_app(
    store: LabelStore, token: str | None = None, allowed_hosts: frozenset[str] | None = None
) -> FastAPI:
    """Build the app around a store. ``token``/``allowed_hosts``: see ``security``."""
    app = FastAPI(title="rlhfkit labelling", docs_url=None, redoc_url=None, openapi_url=None)
    app.middleware("http")(make_middleware(token, allowed_hosts))
    static = {name: _static(name) for name in STATIC_TYPES}
    index = _static("index.html")

    @app.exception_handler(LabelError)
    async def _label_error(_: Request, exc: LabelError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": _validation_message(exc)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)

    def state(name: str) -> dict:
        p = store.progress(name)
        return {
            "labeller": name,
            "progress": {"done": p.done, "total": p.total, "voted": p.voted, "skipped": p.skipped},
            "overall": store.overall(),
        }

    @app.get("/", response_class=HTMLResponse)
    def page() -> HTMLResponse:
        return HTMLResponse(index)

    @app.get("/static/{name}")
    def static_file(name: str) -> Response:
        if name not in static:
            return JSONResponse({"error": "no such file"}, status_code=404)
        return Response(static[name], media_type=STATIC_TYPES[name])

    @app.get("/api/health")
    def health() -> dict:
        return {"ok": True}

    @app.post("/api/labellers")
    def register(body: LabellerBody) -> dict:
        store.register(body.labeller)
        return state(body.labeller)

    @app.post("/api/next")
    def next_pair(body: LabellerBody) -> dict:
        shown = store.next_pair(body.labeller)
        pair = None if shown is None else {
            "pair_id": shown.pair_id, "prompt": shown.prompt, "left": shown.left, "right": shown.right
        }
        return {"pair": pair, **state(body.labeller)}

    @app.post("/api/votes")
    def vote(body: VoteBody) -> JSONResponse:
        result = store.submit_vote(body.labeller, body.pair_id, body.choice, body.request_id)
        payload = {"stored": result.stored, "duplicate": not result.stored, "pair_id": body.pair_id}
        return JSONResponse({**payload, **state(body.labeller)}, status_code=201 if result.stored else 200)

    @app.post("/api/skip")
    def skip(body: SkipBody) -> dict:
        result = store.skip(body.labeller, body.pair_id)
        return {"stored": result.stored, "pair_id": body.pair_id, **state(body.labeller)}

    @app.post("/api/undo")
    def undo(body: LabellerBody) -> dict:
        return {"undone": store.undo(body.labeller), **state(body.labeller)}

    return app
