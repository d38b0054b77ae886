"""The labelling web app: a small JSON API and a static page (``static/``).

Two ways to know who is labelling (``auth``):

- ``open`` (the loopback default): the labeller types a name; every body carries
  ``"labeller"``. Anyone who can reach the app can act under any name, so this is for one
  person's machine.
- ``invite``: each labeller signs in with the personal link ``rlhfkit label invite NAME``
  printed (``/?invite=TOKEN``). Opening the link only shows the page, which asks "Sign in as
  NAME?"; the sign-in itself is a same-origin JSON POST (``/api/signin``), so another site
  cannot sign a browser in as someone else by sending it to a link (login CSRF). It leaves
  an HttpOnly cookie ``label_session_PORT`` holding a session id of its own, not the link's
  secret, that ends with the link (expiry, a new invitation, revoke). Scripts may send
  ``X-Labeller-Token: TOKEN`` instead. Every action is taken as that labeller; a body naming
  anyone else gets 403.

API (all POST bodies are JSON; errors are ``{"error": "one line"}`` with a 4xx status):

=======================  ==========================================  ============================
route                    body                                        answer
=======================  ==========================================  ============================
GET  /                   - (``?invite=TOKEN``: 401 unless it is live) the labelling page
GET  /static/{name}      -                                           app.js, style.css
GET  /api/health         -                                           {"ok": true}
GET  /api/session        -                                           {"auth", "labeller" | null}
POST /api/invitation     {"invite"}                                  {"labeller", "current" | null}
POST /api/signin         {"invite"}                                  {"auth", "labeller"} + cookie
POST /api/labellers      {"labeller"} (open) or {} (invite)          progress (registers name)
POST /api/next           {"labeller"?}                               {"pair": {pair_id, prompt,
                                                                     left, right} | null, ...}
POST /api/votes          {"labeller"?, "pair_id", "choice": 1..5,    201 stored, 200 replay
                         "request_id"}
POST /api/skip           {"labeller"?, "pair_id"}                    200
POST /api/undo           {"labeller"?}                               {"undone": pair_id | null,
                                                                     "reopened": bool}
GET  /api/config         -                                           {"criteria": [...],
                                                                     "guidelines": text | null}
POST /api/history        {"labeller"?}                               {"votes": [...]} own, newest
GET  /lead               - (``?lead=LEAD_TOKEN`` once; 404 unless    the lead's page
                         ``serve --lead-token``)
GET  /api/lead/disputed  header ``X-Lead-Token``                     {"pairs": [...]} (A/B frame)
POST /api/lead/resolve   {"pair_id", "choice": 1..5 (1 = A much      200; the final label, apart
                         better), "note"?} + ``X-Lead-Token``        from the votes
=======================  ==========================================  ============================

A vote may carry ``"reason"`` (free text, at most 2,000 characters) and ``"ratings"``
(``{criterion: 1..5}``, same frame as ``choice``, only criteria named by ``serve --criteria``).

``choice`` is in the frame the labeller saw (1 = left significantly better ... 5 = right
significantly better); the server, which stored the left/right order when it handed out the
pair, converts it to the canonical A/B score. Model names never reach the browser.
"""

from __future__ import annotations

import secrets
from importlib import resources
from typing import Annotated

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlhfkit.label.identity import clean_name, name_key
from rlhfkit.label.pairs import PAIR_ID_RULE, is_pair_id
from rlhfkit.label.rationale import MAX_CRITERIA, MAX_REASON_CHARS, clean_reason
from rlhfkit.label.records import Forbidden, Invalid, LabelError, NotFound, Unauthorized
from rlhfkit.label.review import disagreements, history
from rlhfkit.label.scale import score_from_choice
from rlhfkit.label.security import SecurityMiddleware, cookie_name
from rlhfkit.label.store import LabelStore

# FastAPI's built-in OpenTelemetry export, switched on from the environment
# (FASTAPI_OTEL_AUTO_CONFIGURE=true), would send every URL's query, the access token and
# invitation secrets included, to the collector in clear text: off, whatever the environment.
NO_TELEMETRY = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False, "auto_configure": False}
STATIC_TYPES = {"app.js": "text/javascript; charset=utf-8", "render.js": "text/javascript; charset=utf-8",
                "lead.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
LEAD_HEADER = "x-lead-token"
HISTORY_LIMIT = 200
AUTH_MODES = ("open", "invite")
CREDENTIAL_HEADER = "x-labeller-token"
DEAD_LINK = "unknown, replaced or expired invitation link; ask for a new one"


def _check_pair_id(value: str) -> str:
    if not is_pair_id(value):
        raise ValueError(f"pair_id must be {PAIR_ID_RULE}")
    return value


LabellerName = Annotated[str, StringConstraints(max_length=200), AfterValidator(clean_name)]
PairId = Annotated[str, StringConstraints(max_length=128), AfterValidator(_check_pair_id)]
RequestId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{8,64}$")]
Choice = Annotated[int, Field(strict=True, ge=1, le=5)]
Reason = Annotated[str, StringConstraints(max_length=MAX_REASON_CHARS + 200), AfterValidator(clean_reason)]
Criterion = Annotated[str, StringConstraints(max_length=32)]


class InviteBody(BaseModel):
    """An invitation link's secret, posted by the page to look it up or to sign in."""

    model_config = ConfigDict(extra="forbid")
    invite: Annotated[str, StringConstraints(max_length=128)]


class LabellerBody(BaseModel):
    """Who acts: required in open mode; in invite mode optional and must be the signed-in labeller."""

    model_config = ConfigDict(extra="forbid")
    labeller: LabellerName | None = None


class SkipBody(LabellerBody):
    pair_id: PairId


class VoteBody(SkipBody):
    choice: Choice
    request_id: RequestId = Field(description="client-made id; a replay with the same id is stored once")
    reason: Reason = ""
    ratings: Annotated[dict[Criterion, Choice], Field(max_length=MAX_CRITERIA)] = Field(default_factory=dict)


class ResolveBody(BaseModel):
    """A lead's final label: ``choice`` in the A/B frame (1 = A significantly better)."""

    model_config = ConfigDict(extra="forbid")
    pair_id: PairId
    choice: Choice
    note: Reason = ""


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


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(LabelError)
    async def _label_error(_: Request, exc: LabelError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": _validation_message(exc)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)


class Identity:
    """Decides which labeller a request acts as (see the module docstring)."""

    def __init__(self, store: LabelStore, auth: str) -> None:
        if auth not in AUTH_MODES:
            raise ValueError(f"auth must be one of {AUTH_MODES}, got {auth!r}")
        self.store, self.auth = store, auth

    def signed_in(self, request: Request) -> str | None:
        """Invite mode: the labeller whose link (header) or session (cookie) the request carries
        (None in open mode)."""
        if self.auth != "invite":
            return None
        if (token := request.headers.get(CREDENTIAL_HEADER)) is not None:
            return self.store.authenticate(token)
        session = request.cookies.get(cookie_name("session", request.scope))
        return self.store.session_labeller(session) if session else None

    def invited(self, invite: str) -> str:
        """The labeller a live invitation secret belongs to, or 401."""
        name = self.store.authenticate(invite) if self.auth == "invite" else None
        if name is None:
            raise Unauthorized(DEAD_LINK)
        return name

    def acting(self, request: Request, claimed: str | None) -> str:
        """The labeller to act as, or 401/403/422."""
        if self.auth == "open":
            if claimed is None:
                raise Invalid("labeller: Field required")
            return claimed
        who = self.signed_in(request)
        if who is None:
            raise Unauthorized("not signed in: open your personal invitation link (`rlhfkit label invite NAME`)")
        if claimed is not None and name_key(claimed) != name_key(who):
            raise Forbidden(f"signed in as {who!r}; cannot act as {claimed!r}")
        return who


def create_app(
    store: LabelStore, token: str | None = None, allowed_hosts: frozenset[str] | None = None, auth: str = "open",
    criteria: tuple[str, ...] = (), guidelines: str | None = None, lead_token: str | None = None,
) -> FastAPI:
    """Build the app around a store. ``token``/``allowed_hosts``: see ``security``; ``auth``: above;
    ``criteria``: names labellers may rate (``rationale.parse_criteria``); ``guidelines``:
    Markdown shown in a pane; ``lead_token``: the secret of the lead's view (None: no lead view)."""
    app = FastAPI(title="rlhfkit labelling", docs_url=None, redoc_url=None, openapi_url=None, telemetry=NO_TELEMETRY)
    app.add_middleware(SecurityMiddleware, token=token, allowed_hosts=allowed_hosts)
    _install_error_handlers(app)
    identity = Identity(store, auth)
    _add_page_routes(app, identity)
    _add_api_routes(app, identity, criteria)
    _add_review_routes(app, identity, criteria, guidelines, lead_token)
    return app


def _add_page_routes(app: FastAPI, identity: Identity) -> None:
    """The page (and sign-in through ``?invite=``), its static files, health and session."""
    static = {name: _static(name) for name in STATIC_TYPES}
    index = _static("index.html")

    @app.get("/", response_class=HTMLResponse)
    def page(invite: str | None = None) -> Response:
        if invite is not None:
            identity.invited(invite)  # a dead link says so; a live one signs nobody in by itself
        return HTMLResponse(index)

    @app.post("/api/invitation")
    def invitation(request: Request, body: InviteBody) -> dict:
        return {"labeller": identity.invited(body.invite), "current": identity.signed_in(request)}

    @app.post("/api/signin")
    def sign_in(request: Request, body: InviteBody) -> JSONResponse:
        signed = identity.store.sign_in(body.invite) if identity.auth == "invite" else None
        if signed is None:
            raise Unauthorized(DEAD_LINK)
        response = JSONResponse({"auth": identity.auth, "labeller": signed[0]})
        response.set_cookie(cookie_name("session", request.scope), signed[1], httponly=True, samesite="strict",
                            path="/")
        return response

    @app.get("/static/{name}")
    def static_file(name: str) -> Response:
        if name not in static:
            return JSONResponse({"error": "no such file"}, status_code=404)
        return Response(static[name], media_type=STATIC_TYPES[name])

    @app.get("/api/health")
    def health() -> dict:
        return {"ok": True}

    @app.get("/api/session")
    def session(request: Request) -> dict:
        return {"auth": identity.auth, "labeller": identity.signed_in(request)}


def _add_api_routes(app: FastAPI, identity: Identity, criteria: tuple[str, ...] = ()) -> None:
    """The labelling actions; each acts as ``identity.acting(...)``."""
    store = identity.store

    def state(name: str) -> dict:
        p = store.progress(name)
        return {
            "labeller": p.name,
            "progress": {"done": p.done, "total": p.total, "voted": p.voted, "skipped": p.skipped},
            "overall": store.overall(),
        }

    @app.post("/api/labellers")
    def register(request: Request, body: LabellerBody) -> dict:
        name = identity.acting(request, body.labeller)
        if identity.auth == "open":
            store.register(name)
        return state(name)

    @app.post("/api/next")
    def next_pair(request: Request, body: LabellerBody) -> dict:
        name = identity.acting(request, body.labeller)
        shown = store.next_pair(name)
        pair = None if shown is None else {
            "pair_id": shown.pair_id, "prompt": shown.prompt, "left": shown.left, "right": shown.right
        }
        return {"pair": pair, **state(name)}

    @app.post("/api/votes")
    def vote(request: Request, body: VoteBody) -> JSONResponse:
        name = identity.acting(request, body.labeller)
        unknown = sorted(set(body.ratings) - set(criteria))
        if unknown:
            raise Invalid(f"ratings: unknown criterion {unknown[0]!r}; this server rates "
                          f"{', '.join(criteria) if criteria else 'no criteria'}")
        result = store.submit_vote(name, body.pair_id, body.choice, body.request_id, body.reason, body.ratings)
        payload = {"stored": result.stored, "duplicate": not result.stored, "pair_id": body.pair_id}
        return JSONResponse({**payload, **state(name)}, status_code=201 if result.stored else 200)

    @app.post("/api/skip")
    def skip(request: Request, body: SkipBody) -> dict:
        name = identity.acting(request, body.labeller)
        result = store.skip(name, body.pair_id)
        return {"stored": result.stored, "pair_id": body.pair_id, **state(name)}

    @app.post("/api/undo")
    def undo(request: Request, body: LabellerBody) -> dict:
        name = identity.acting(request, body.labeller)
        result = store.undo_last(name)
        undone = {"undone": None, "reopened": False} if result is None else {
            "undone": result.pair_id, "reopened": result.reopened}
        return {**undone, **state(name)}


def _add_review_routes(app: FastAPI, identity: Identity, criteria: tuple[str, ...], guidelines: str | None,
                       lead_token: str | None) -> None:
    """Settings the page shows, a labeller's own history, and the lead's view."""
    store = identity.store
    lead_page = _static("lead.html")

    def lead_only(request: Request) -> None:
        if lead_token is None:
            raise NotFound("no lead view: start `rlhfkit label serve` with a lead token")
        given = request.headers.get(LEAD_HEADER, "")
        if not secrets.compare_digest(given.encode(), lead_token.encode()):
            raise Unauthorized("missing or wrong lead token: open the lead's link that `rlhfkit label serve` printed")

    @app.get("/api/config")
    def config() -> dict:
        return {"criteria": list(criteria), "guidelines": guidelines}

    @app.post("/api/history")
    def own_history(request: Request, body: LabellerBody) -> dict:
        name = store.progress(identity.acting(request, body.labeller)).name  # 404 for an unknown name
        return {"votes": history(store.votes_of(name_key(name), HISTORY_LIMIT))}

    @app.get("/lead", response_class=HTMLResponse)
    def lead() -> Response:
        if lead_token is None:
            raise NotFound("no lead view: start `rlhfkit label serve` with a lead token")
        return HTMLResponse(lead_page)

    @app.get("/api/lead/disputed")
    def disputed(request: Request) -> dict:
        lead_only(request)
        return {"pairs": disagreements(store.votes(), store.resolutions()), "criteria": list(criteria)}

    @app.post("/api/lead/resolve")
    def resolve(request: Request, body: ResolveBody) -> dict:
        lead_only(request)
        score = score_from_choice(body.choice, "a")
        store.resolve(body.pair_id, score, body.note)
        return {"pair_id": body.pair_id, "score": score, "note": body.note}
