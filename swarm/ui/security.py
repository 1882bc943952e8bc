"""Who may use the cockpit: a one-time login link, a session cookie, CSRF, Host and Origin checks.

The server listens on 127.0.0.1 only, but any web page the user visits can make their browser
send requests to 127.0.0.1, and a DNS-rebinding page can even read the answers. So:

- `swarm ui` prints a URL with a one-time token. Opening it (`GET /login?token=...`) exchanges
  the token for a random session id in a cookie that is `HttpOnly` (no script reads it) and
  `SameSite=Strict` (no other site's page sends it); the token then stops working. Every other
  request needs that session: without it, 401.
- Every POST carries the session's CSRF token in the `X-CSRF-Token` header (the pages' script
  reads it from a `<meta>` tag of a page it was served); a POST without it, or with another
  session's, is refused with 403. A cross-site form cannot set a header.
- The `Host` header must name the address the server listens on (`127.0.0.1:PORT` or
  `localhost:PORT`): a rebinding attacker's page sends its own host name, refused with 403
  before anything else runs. An `Origin` header, when present, must be that origin too.
- Every answer forbids framing and inline scripts (CSP), sniffing, caching and referrers.
"""
from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

COOKIE = "swarm_session"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = ("GET", "HEAD")
HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                                "connect-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; "
                                "form-action 'self'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass
class Guard:
    """The login token, the sessions and the checks, for a server on 127.0.0.1:`port`."""

    port: int
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    used: bool = False
    sessions: dict[str, str] = field(default_factory=dict)   # session id → its CSRF token
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def hosts(self) -> set[str]:
        return {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}

    @property
    def origins(self) -> set[str]:
        return {f"http://{h}" for h in self.hosts}

    def login_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/login?token={self.token}"

    def redeem(self, token: str) -> str | None:
        """A new session id for the one-time token, None when it is wrong or already used."""
        with self._lock:
            if self.used or not secrets.compare_digest(token.encode(), self.token.encode()):
                return None
            self.used = True
            sid = secrets.token_urlsafe(32)
            self.sessions[sid] = secrets.token_urlsafe(32)
            return sid

    def csrf(self, request: Request) -> str | None:
        return self.sessions.get(request.cookies.get(COOKIE, ""))

    def refuse(self, request: Request) -> Response | None:
        """The answer that refuses `request`, None when it may go on."""
        host = request.headers.get("host", "")
        if host not in self.hosts:
            return PlainTextResponse(f"refused: Host {host!r} is not this server's address", status_code=403)
        origin = request.headers.get("origin")
        if origin is not None and origin not in self.origins:
            return PlainTextResponse(f"refused: Origin {origin!r} is not this server", status_code=403)
        if request.url.path == "/login" and request.method in SAFE_METHODS:
            return None
        csrf = self.csrf(request)
        if csrf is None:
            return PlainTextResponse("not logged in: open the link `swarm ui` printed (it works once)", status_code=401)
        if request.method not in SAFE_METHODS:
            sent = request.headers.get(CSRF_HEADER, "")
            if not sent or not secrets.compare_digest(sent.encode(), csrf.encode()):
                return PlainTextResponse(f"refused: a POST needs the {CSRF_HEADER} header of this session", status_code=403)
        return None

    def login(self, request: Request) -> Response:
        sid = self.redeem(request.query_params.get("token", ""))
        if sid is None:
            return PlainTextResponse("this login link is wrong or was already used; restart `swarm ui` for a new one",
                                     status_code=403)
        resp = RedirectResponse("/", status_code=303)
        resp.set_cookie(COOKIE, sid, httponly=True, samesite="strict", path="/")
        return resp

    def middleware(self) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
        async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            resp = self.refuse(request)
            if resp is None:
                resp = self.login(request) if request.url.path == "/login" else await call_next(request)
            for k, v in HEADERS.items():
                resp.headers.setdefault(k, v)
            return resp
        return guard
