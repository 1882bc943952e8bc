"""The cockpit's web app: server-rendered pages (Jinja2) kept live with server-sent events.

    app, guard = make_app(Runs(root=pathlib.Path("runs")), port=8765)
    print(guard.login_url())          # the one-time link
    serve(app, sock)                  # uvicorn on a socket bound to 127.0.0.1

Pages: `/` (runs), `/r/<run>/` (a run), `/r/<run>/iv/<id>/` (an intervention's PR),
`/r/<run>/skills`. Each page names its event stream in `<body data-events=...>`; the stream sends
`update` events whose data maps element ids to re-rendered fragments (the same templates the page
was built from), which `static/cockpit.js` swaps in. Charts are SVG drawn on the server by
`swarm.plots` from downsampled metrics (`swarm.ui.data.downsample`). The buttons POST to
`/r/<run>/iv/<id>/<action>` and `/r/<run>/stop`, which call `swarm.cli.queue_human` /
`request_stop` — the functions behind `swarm approve|reject|rollback|stop` — with the acting
user recorded as `ui:<user>`. Security: see `swarm.ui.security`.
"""
from __future__ import annotations

import asyncio
import json
import pathlib
import threading
import time
from typing import Any, AsyncIterator

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markdown_it import MarkdownIt
from starlette.concurrency import run_in_threadpool

from swarm.ui.data import RunView, discover
from swarm.ui.security import CSRF_HEADER, Guard

HERE = pathlib.Path(__file__).resolve().parent
POLL_S = 0.5          # how often an event stream looks for changes (a new metrics row shows within ~1 s)
KEEPALIVE_S = 15.0
MEDIA = {".png": "image/png", ".svg": "image/svg+xml"}


class Runs:
    """The workspaces the cockpit serves: one (`workspace`), or every one under `root`, found
    again on each look so new runs appear. Views are kept per path."""

    def __init__(self, workspace: pathlib.Path | None = None, root: pathlib.Path | None = None) -> None:
        if (workspace is None) == (root is None):
            raise ValueError("give exactly one of workspace or root")
        self.workspace, self.root = workspace, root
        self._views: dict[pathlib.Path, RunView] = {}
        self._found: tuple[float, dict[str, pathlib.Path]] | None = None
        self._lock = threading.Lock()

    DISCOVER_EVERY_S = 2.0   # every event stream asks twice a second; the folder walk is shared

    def found(self) -> dict[str, pathlib.Path]:
        if self.workspace is not None:
            ws = self.workspace.resolve()
            return {ws.name: ws}
        now = time.monotonic()
        with self._lock:
            if self._found is None or now - self._found[0] >= self.DISCOVER_EVERY_S:
                found = discover(self.root)
                self._found = (now, {(self.root.resolve().name if k == "." else k).replace("/", "~"): v
                                     for k, v in found.items()})
            return dict(self._found[1])

    def view(self, slug: str) -> RunView:
        path = self.found().get(slug)
        if path is None:
            raise HTTPException(404, f"no run {slug!r} here")
        with self._lock:   # one view (one sqlite connection) per workspace, whichever thread asks first
            if path not in self._views:
                try:
                    self._views[path] = RunView(slug, path)
                except ValueError as e:   # its state database is damaged (swarm.store.StateDbError): one line
                    raise HTTPException(409, str(e)) from None
            return self._views[path]

    def views(self) -> list[RunView]:
        """Every run that can be shown; one whose state database is damaged is left out (its own
        page says why)."""
        out = []
        for slug in self.found():
            try:
                out.append(self.view(slug))
            except HTTPException:
                continue
        return out

    def close(self) -> None:
        for v in self._views.values():
            v.close()


def _markdown() -> MarkdownIt:
    # raw HTML in a report is shown as text, never rendered: html=False
    return MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        if unit == "$":
            return f"${v:.2f}"
        return f"{v:.4g}{unit}" if abs(v) < 1e4 else f"{v:,.0f}{unit}"
    return f"{v}{unit}"


def _diff_files(diff: str) -> list[dict[str, Any]]:
    """The diff cut per file: {"path", "lines": [(css class, line)], "report": under reports/}."""
    files: list[dict[str, Any]] = []
    for line in diff.splitlines():
        if line.startswith("diff --git ") or not files:
            path = line.split(" b/", 1)[-1] if line.startswith("diff --git ") else ""
            files.append({"path": path, "lines": [], "report": path.startswith("reports/")})
        cls = ("hunk" if line.startswith("@@") else "meta" if line.startswith(("diff ", "index ", "+++", "---", "new file"))
               else "add" if line.startswith("+") else "del" if line.startswith("-") else "")
        files[-1]["lines"].append((cls, line))
    return files


def make_app(runs: Runs, port: int, guard: Guard | None = None) -> tuple[FastAPI, Guard]:
    guard = guard or Guard(port=port)
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = _fmt
    env.filters["pct"] = lambda f: "—" if f is None else f"{100 * f:.0f}%"
    md = _markdown()
    app = FastAPI(title="swarm cockpit", docs_url=None, redoc_url=None, openapi_url=None)
    app.middleware("http")(guard.middleware())
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.state.runs, app.state.guard = runs, guard

    def page(request: Request, name: str, events: str | None, **ctx: Any) -> HTMLResponse:
        html = env.get_template(name).render(csrf=guard.csrf(request), events=events, csrf_header=CSRF_HEADER, **ctx)
        return HTMLResponse(html)

    def fragment(name: str, **ctx: Any) -> str:
        return env.get_template(name).render(**ctx)

    # ---- runs --------------------------------------------------------------------------------
    def runs_ctx() -> dict[str, Any]:
        return {"runs": [v.overview() for v in runs.views()]}

    @app.get("/", response_class=HTMLResponse)
    async def runs_page(request: Request) -> HTMLResponse:
        ctx = await run_in_threadpool(runs_ctx)
        return page(request, "runs.html", "/events", **ctx)

    @app.get("/events")
    async def runs_events(request: Request) -> StreamingResponse:
        def sig() -> Any:
            return tuple((v.name, v.signature()) for v in runs.views())

        def parts() -> dict[str, str]:
            return {"runs-table": fragment("_runs_table.html", **runs_ctx())}
        return _stream(request, sig, parts)

    # ---- a run ---------------------------------------------------------------------------------
    def run_ctx(v: RunView) -> dict[str, Any]:
        harness, recipe = v.harness_recipe()
        return {"run": v.overview(), "svg": v.curves_svg(), "timeline": v.timeline(), "ivs": list(reversed(v.interventions())),
                "harness": harness, "recipe": recipe, "harness_version": v.live_harness_version()}

    def run_parts(v: RunView) -> dict[str, str]:
        ctx = run_ctx(v)
        return {"run-status": fragment("_run_status.html", **ctx), "curves": ctx["svg"],
                "timeline": fragment("_timeline.html", **ctx), "iv-list": fragment("_iv_list.html", **ctx),
                "config": fragment("_config.html", **ctx)}

    @app.get("/r/{run}/", response_class=HTMLResponse)
    async def run_page(request: Request, run: str) -> HTMLResponse:
        v = runs.view(run)
        ctx = await run_in_threadpool(run_ctx, v)
        return page(request, "run.html", f"/r/{run}/events", **ctx)

    @app.get("/r/{run}/events")
    async def run_events(request: Request, run: str) -> StreamingResponse:
        v = runs.view(run)
        return _stream(request, v.signature, lambda: run_parts(v))

    @app.get("/r/{run}/curves.svg")
    async def run_curves(run: str, points: int = 800) -> Response:
        v = runs.view(run)
        if not 10 <= points <= 20_000:
            raise HTTPException(422, f"points={points}: must be between 10 and 20000")
        svg = await run_in_threadpool(v.curves_svg, points)
        return Response(svg, media_type="image/svg+xml")

    @app.post("/r/{run}/stop")
    async def stop(run: str) -> JSONResponse:
        from swarm.cli import acting_user, request_stop

        v = runs.view(run)
        try:
            msg = await run_in_threadpool(request_stop, v.root, acting_user("ui"))
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=409)
        return JSONResponse({"message": msg})

    # ---- an intervention -----------------------------------------------------------------------
    def iv_ctx(v: RunView, iid: str) -> dict[str, Any]:
        try:
            d = v.intervention_page(iid)
        except KeyError:
            raise HTTPException(404, f"no intervention {iid!r} in run {v.name!r}") from None
        return {"run": {"name": v.name}, **d, "report_html": md.render(d["report"]), "diff_files": _diff_files(d["diff"])}

    def iv_parts(v: RunView, iid: str) -> dict[str, str]:
        ctx = iv_ctx(v, iid)
        return {"iv-head": fragment("_iv_head.html", **ctx), "lifecycle": fragment("_lifecycle.html", **ctx),
                "report": ctx["report_html"]}

    @app.get("/r/{run}/iv/{iid}/", response_class=HTMLResponse)
    async def iv_page(request: Request, run: str, iid: str) -> HTMLResponse:
        v = runs.view(run)
        ctx = await run_in_threadpool(iv_ctx, v, iid)
        return page(request, "intervention.html", f"/r/{run}/iv/{iid}/events", **ctx)

    @app.get("/r/{run}/iv/{iid}/events")
    async def iv_events(request: Request, run: str, iid: str) -> StreamingResponse:
        v = runs.view(run)
        iv_ctx(v, iid)    # 404 now rather than in the stream
        return _stream(request, v.signature, lambda: iv_parts(v, iid))

    @app.get("/r/{run}/iv/{iid}/{name}")
    async def iv_file(run: str, iid: str, name: str) -> Response:
        v = runs.view(run)
        media = MEDIA.get(pathlib.PurePath(name).suffix)
        data = await run_in_threadpool(v.pr_file, iid, name) if media else None
        if data is None:
            raise HTTPException(404, f"intervention {iid!r} has no attachment {name!r}")
        # an attachment opened on its own runs nothing: no scripts, no plugins
        return Response(data, media_type=media, headers={"Content-Security-Policy": "sandbox; default-src 'none'; style-src 'unsafe-inline'"})

    @app.post("/r/{run}/iv/{iid}/{action}")
    async def iv_action(run: str, iid: str, action: str) -> JSONResponse:
        from swarm.cli import HUMAN_ACTIONS, acting_user, queue_human

        v = runs.view(run)
        if action not in HUMAN_ACTIONS:
            raise HTTPException(404, f"no action {action!r} (one of {', '.join(HUMAN_ACTIONS)})")
        try:
            msg = await run_in_threadpool(queue_human, v.root, iid, action, acting_user("ui"))
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=409)
        return JSONResponse({"message": msg})

    # ---- skills --------------------------------------------------------------------------------
    @app.get("/r/{run}/skills", response_class=HTMLResponse)
    async def skills_page(request: Request, run: str) -> HTMLResponse:
        v = runs.view(run)
        skills, errors = await run_in_threadpool(v.skills)
        return page(request, "skills.html", None, run={"name": v.name}, skills=skills, errors=errors)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        if request.method == "POST":
            return JSONResponse({"error": exc.detail}, status_code=exc.status_code)
        return HTMLResponse(env.get_template("error.html").render(status=exc.status_code, detail=exc.detail, csrf=None,
                                                                  events=None), status_code=exc.status_code)

    return app, guard


def _stream(request: Request, signature, parts) -> StreamingResponse:
    """Server-sent events: an `update` with fresh fragments whenever `signature()` changes, a
    comment every KEEPALIVE_S otherwise; ends when the client goes away."""
    async def gen() -> AsyncIterator[bytes]:
        last, quiet = object(), 0.0
        while not await request.is_disconnected():
            sig = await run_in_threadpool(signature)
            if sig != last:
                last = sig
                data = await run_in_threadpool(parts)
                yield f"event: update\ndata: {json.dumps(data)}\n\n".encode()
                quiet = 0.0
            elif quiet >= KEEPALIVE_S:
                yield b": keepalive\n\n"
                quiet = 0.0
            await asyncio.sleep(POLL_S)
            quiet += POLL_S
    return StreamingResponse(gen(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})


def serve(app: FastAPI, sock, log_level: str = "warning"):
    """Run uvicorn on `sock` (already bound to 127.0.0.1) until interrupted; returns the server."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=2, lifespan="off"))
    server.run(sockets=[sock])
    return server


def bind(port: int) -> Any:
    """A listening socket on 127.0.0.1:`port` (0 = any free port)."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    sock.set_inheritable(True)
    return sock
