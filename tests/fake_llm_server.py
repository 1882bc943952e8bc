"""A scripted OpenAI-compatible chat server for end-to-end tests of the LLM client path.

    with FakeLLMServer() as srv:
        srv.push(tool_call("no_action", {"reason": "healthy"}), http_error(500))
        litellm.completion(model="openai/fake", api_base=srv.url, api_key="x", messages=[...])
        srv.requests[-1]["messages"]      # what the client sent

Standard-library `http.server` on 127.0.0.1 (a random free port), serving from a thread. Each
POST to `/v1/chat/completions` pops the next scripted `Reply` (the shape of openai-agents-python's
`tests/fake_model.py`: a queue of outputs, every call recorded): plain text, tool calls (with
arguments as given — a string is sent verbatim, so malformed JSON is easy to script), a delay
before answering (longer than the client's timeout → the client times out), or an HTTP error
status. An empty queue answers HTTP 500 "no scripted reply left" so a test that calls more often
than it scripted fails loudly. `"stream": true` is answered as server-sent events (one delta with
the whole message, then a finish chunk with usage, then `[DONE]`).

The server is threaded, so a request still sleeping in a delayed reply does not block the next
one; `close()` wakes any sleeper.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclasses.dataclass
class Reply:
    content: str | None = None
    tool_calls: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (name, raw arguments)
    delay_s: float = 0.0
    status: int = 200
    error_body: str = ""
    prompt_tokens: int = 100
    completion_tokens: int = 20


def text(content: str, **kw: Any) -> Reply:
    return Reply(content=content, **kw)


def tool_call(name: str, arguments: dict | str, **kw: Any) -> Reply:
    """One tool call; a dict is JSON-encoded, a string is sent verbatim (malformed JSON, ...)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return Reply(tool_calls=[(name, raw)], **kw)


def tool_calls(*calls: tuple[str, dict | str], **kw: Any) -> Reply:
    return Reply(tool_calls=[(n, a if isinstance(a, str) else json.dumps(a)) for n, a in calls], **kw)


def delay(seconds: float, reply: Reply | None = None) -> Reply:
    r = dataclasses.replace(reply) if reply else text("late")
    r.delay_s = seconds
    return r


def http_error(status: int = 500, body: str = "scripted server error") -> Reply:
    return Reply(status=status, error_body=body)


class FakeLLMServer:
    def __init__(self, replies: list[Reply] | None = None, model: str = "fake") -> None:
        self.model = model
        self.replies: collections.deque[Reply] = collections.deque(replies or [])
        self.requests: list[dict[str, Any]] = []      # JSON bodies, in arrival order
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._n = 0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-llm", daemon=True)
        self._thread.start()

    # ---- scripting ---------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """The api_base for an OpenAI-compatible client."""
        return f"http://127.0.0.1:{self.port}/v1"

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def close(self) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "FakeLLMServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- serving -----------------------------------------------------------------------------
    def _record(self, body: dict[str, Any], path: str, headers: dict[str, str]) -> int:
        """Keep the request; its number (call under `_lock`)."""
        self.requests.append(body)
        self.paths.append(path)
        self.headers.append(headers)
        self._n += 1
        return self._n

    def _next(self, body: dict[str, Any], path: str, headers: dict[str, str]) -> tuple[Reply | None, int]:
        with self._lock:
            n = self._record(body, path, headers)
            return (self.replies.popleft() if self.replies else None), n

    def _message(self, r: Reply, n: int) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": r.content}
        if r.tool_calls:
            msg["tool_calls"] = [
                {"id": f"call_{n}_{i}", "type": "function", "function": {"name": name, "arguments": args}}
                for i, (name, args) in enumerate(r.tool_calls)
            ]
        return msg

    def _usage(self, r: Reply) -> dict[str, int]:
        return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                "total_tokens": r.prompt_tokens + r.completion_tokens}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def _send(self, status: int, payload: bytes, ctype: str = "application/json") -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout) before the scripted delay ended

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, json.dumps({"object": "list", "data": [
                        {"id": server.model, "object": "model", "owned_by": "fake"}]}).encode())
                else:
                    self._send(404, b'{"error": {"message": "not found"}}')

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, b'{"error": {"message": "not found"}}')
                    return
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    body = {"_unparsed": raw.decode("utf-8", "replace")}
                r, n = server._next(body, self.path, {k.lower(): v for k, v in self.headers.items()})
                if r is None:
                    self._send(500, json.dumps({"error": {"message": "no scripted reply left", "type": "server_error"}}).encode())
                    return
                if r.delay_s and server._closing.wait(r.delay_s):
                    return
                if r.status != 200:
                    self._send(r.status, json.dumps({"error": {"message": r.error_body, "type": "server_error"}}).encode())
                    return
                msg = server._message(r, n)
                finish = "tool_calls" if r.tool_calls else "stop"
                base = {"id": f"chatcmpl-{n}", "created": int(time.time()), "model": body.get("model", server.model)}
                if body.get("stream"):
                    delta = dict(msg)
                    if "tool_calls" in delta:
                        delta["tool_calls"] = [dict(tc, index=i) for i, tc in enumerate(delta["tool_calls"])]
                    chunks = [
                        {**base, "object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                        {**base, "object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": server._usage(r)},
                    ]
                    payload = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
                    self._send(200, payload.encode(), "text/event-stream")
                    return
                resp = {**base, "object": "chat.completion",
                        "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                        "usage": server._usage(r)}
                self._send(200, json.dumps(resp).encode())

        return Handler
