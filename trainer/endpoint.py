"""An OpenAI-compatible policy endpoint: any agent program can act with the policy being trained.

`EndpointServer` serves `POST /v1/chat/completions` (uvicorn, in a thread) on
127.0.0.1 at a free port, every request authenticated with a bearer token (a random one unless
given; 401 with an OpenAI-style error body without it). Requests are rendered with the agent
harness's message template into token ids, the policy generates under the harness's sampling
(the client's `temperature` and `top_p` are recorded, not obeyed; its `max_tokens` can only
shorten a turn), and a completion that holds a tool call in the harness's syntax is returned as
OpenAI `tool_calls` (finish_reason "tool_calls").

Every call is appended to a JSONL trajectory log as one step-level record, grouped by the episode
id the client passes (the `X-Episode-Id` header, else the request's `user` field, else
"default"; an `X-Attempt` header is recorded beside it): the request's messages and tools, the exact prompt and completion token ids as
generated, per-token log-probs (see below), the finish reason, the harness
and weight versions, and whether the prompt extends the episode's previous prompt + completion.
Token ids are never rebuilt from text where they can be known: an assistant message the client
sends back that this server produced for the same episode is replaced by the ids it was generated
as (`reused_assistant` counts them; `retokenized_assistant` counts the ones it had to encode).
`POST /v1/episodes/{id}/reward` appends the episode's reward. Streaming and n > 1 are refused.

    with EndpointServer(policy, harness, log_path) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.token)
        client.chat.completions.create(model="policy", messages=[...], tools=[...], user="episode-1")

The policy is any `trainer.agent_rollout.Generator` (`PolicyGenerator` for the trainer's own).

Concurrent requests are generated together: each request renders its prompt, then queues it for
one batcher thread, which takes every queued prompt and generates them in one `Policy.sample`
call (for a `PolicyGenerator`; any other `Generator` is called row by row). The batch closes as
soon as no request is being rendered and every open connection has a request queued (a client
waiting for its answers sends nothing more on them; uvicorn's connection count), unless one of
them is the first request on its connection (a client opening connections may have more that the
server has not accepted yet); else once arrivals pause for `batch_window_s` (10 ms: an idle
keep-alive connection may be an agent still sending), at most `max_batch` rows and
`batch_wait_s` (50 ms) in all. A split batch costs a whole second generation, a few ms of waiting
do not. An agent that waits for each answer before its next call gets batches of one, closed at
once from its second call on: the same calls, and the same random stream, as without batching.
The log lines of a batch are written before any of its answers is sent, so a client that reads
the log once answered finds its calls there. `stats` counts batches, rows, the seconds spent
generating, waiting for a batch to close (`wait_s`) and building answers and log lines
(`record_s`), and the batches that closed because every request was in (`closed_all_in`).

Per-request overhead is kept small (benchmarks/endpoint_throughput.py): uvicorn serves a plain
ASGI app that checks the token and hands `POST /v1/chat/completions` straight to the endpoint;
only the reward route and the errors of unknown paths and methods go through FastAPI, whose
middleware, routing and dependency stack cost about as much per request as reading and rendering
it. The batcher is woken only when its decision can change, wakes the event loop once per batch
to answer all its requests, and computes the harness version (a hash of the harness) once per batch.

Log-probs: for a `PolicyGenerator` they come out of the sampling loop itself (no second forward):
each completion token's log_softmax(logits)[token] at temperature 1 — the policy's own
distribution, whatever temperature / top_p the harness samples with — which is what the trainer
scores as GRPO's old log-probs (`trainer.logprobs.batch_logprobs`); the two agree up to float
rounding (tests/test_policy_sample.py). Any other `Generator` is scored with its `logprobs`
method, when it has one (else null).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import hmac
import json
import pathlib
import secrets
import socket
import threading
import time
from typing import Any, Awaitable, Callable

from fastapi import Request   # at module level: the routes' annotations are resolved from this module
from starlette.responses import JSONResponse

from harness.agent import AgentHarness
from harness.tools import Malformed, ToolCall, ToolSpec, describe_tools
from trainer.agent_rollout import Generator, PolicyGenerator, cut_at_stop

MAX_BODY_MESSAGES = 512
_compact = json.JSONEncoder(separators=(",", ":")).encode   # one encoder for every log line, not one per line
EPISODE_HEADER = b"x-episode-id"
ATTEMPT_HEADER = b"x-attempt"
CHAT_PATH = "/v1/chat/completions"
MAX_BODY_BYTES = 8 << 20   # a request body past this is refused (413): a policy's turn is a few KB


class _Episode:
    def __init__(self) -> None:
        self.calls = 0
        self.last: list[int] | None = None          # previous prompt + completion ids
        self.produced: dict[str, list[int]] = {}    # canonical assistant text -> completion ids


@dataclasses.dataclass
class _Job:
    """One request, rendered, waiting for its completion."""

    body: dict[str, Any]
    episode: str
    attempt: str | None
    ep: _Episode
    tools: list[ToolSpec] | None
    prompt: list[int]
    reused: int
    retok: int
    max_new: int
    temperature: float
    stop: tuple[str, ...]
    fresh: bool = False   # the first request on its connection: the client may be opening more
    loop: asyncio.AbstractEventLoop | None = None   # the event loop awaiting `done`
    done: asyncio.Future | None = None              # resolved with the response, or the exception


def generate_rows(policy: Generator, prompts: list[list[int]], max_new: int, temperature: float,
                  stop: list[str]) -> tuple[list[list[int]], list[list[float]] | None]:
    """Completions of `prompts`, stop strings cut, and their tokens' log-probs (None when the
    policy has none). A `PolicyGenerator` samples all rows in one `Policy.sample` call (the one
    `PolicyGenerator.generate` makes for one row) that also returns the log-probs, read off the
    logits each token was sampled from; any other `Generator` is called row by row and scored
    with its `logprobs`, when it has one."""
    if isinstance(policy, PolicyGenerator):
        singles = {ids[0] for ids in (policy.tok.encode(s) for s in stop) if len(ids) == 1}
        got = policy.policy.sample(prompts, max_new, temperature=temperature, top_p=policy.top_p,
                                   stop_ids=singles, generator=policy.rng, logprobs=True)
        comps = [cut_at_stop(policy.tok, c[:max_new], stop)[0] for c in got.completions]
        return comps, [lp[: len(c)] for lp, c in zip(got.logprobs, comps)]
    comps = [cut_at_stop(policy.tok, list(policy.generate(p, max_new, temperature, stop))[:max_new], stop)[0]
             for p in prompts]
    if not hasattr(policy, "logprobs"):
        return comps, None
    return comps, [policy.logprobs(p, c) for p, c in zip(prompts, comps)]  # type: ignore[attr-defined]


class EndpointServer:
    def __init__(self, policy: Generator, harness: AgentHarness, log_path: str | pathlib.Path,
                 token: str | None = None, weight_version: str = "", model_name: str = "policy",
                 max_batch: int = 64, batch_window_s: float = 0.01, batch_wait_s: float = 0.05) -> None:
        if token is not None and (not isinstance(token, str) or len(token) < 16):
            raise ValueError("endpoint token must be a string of at least 16 characters")
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch={max_batch!r} must be a positive integer")
        if not 0 <= batch_window_s <= batch_wait_s <= 1.0:
            raise ValueError(f"batch_window_s={batch_window_s!r} and batch_wait_s={batch_wait_s!r} must satisfy "
                             "0 <= batch_window_s <= batch_wait_s <= 1")
        self.policy, self.harness = policy, harness
        self.log_path = pathlib.Path(log_path)
        self.token = token or secrets.token_urlsafe(24)
        self.weight_version, self.model_name = weight_version, model_name
        self.max_batch, self.batch_window_s, self.batch_wait_s = max_batch, batch_window_s, batch_wait_s
        self.episodes: dict[str, _Episode] = {}
        self.stats = {"batches": 0, "rows": 0, "generate_s": 0.0, "wait_s": 0.0, "record_s": 0.0,
                      "closed_all_in": 0}
        self._state_lock = threading.Lock()      # episodes: rendering and recording a call
        self._log_lock = threading.Lock()
        self._queue: collections.deque[_Job] = collections.deque()
        self._queue_cv = threading.Condition()
        self._arriving = 0                       # chat requests being read and rendered, not yet queued
        self._last_arrival = 0.0                 # time.monotonic() of the last job queued
        self._clients: set[Any] = set()          # (host, port) of connections that have sent a request
        self._batcher: threading.Thread | None = None
        self._stopping = False
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None
        self.app = self._make_app()

    # ---- lifecycle --------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self.port is not None, "the server is not started"
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "EndpointServer":
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        # no proxy in front of a loopback server: the peer address (which connections have sent a
        # request, for closing batches) is the socket's, never an X-Forwarded-For a client sends
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False, proxy_headers=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name="policy-endpoint")
        self._thread.start()
        self._stopping = False
        self._batcher = threading.Thread(target=self._batch_loop, daemon=True, name="policy-endpoint-batcher")
        self._batcher.start()
        deadline = time.time() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.time() > deadline:
                raise RuntimeError("the policy endpoint did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._queue_cv:
            self._stopping = True
            self._queue_cv.notify_all()
        if self._batcher is not None:
            self._batcher.join(timeout=10)
        self._server = self._thread = self._batcher = None

    def __enter__(self) -> "EndpointServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- records ----------------------------------------------------------------------
    def _append(self, *records: dict[str, Any]) -> None:
        text = "".join(_compact(r) + "\n" for r in records)
        with self._log_lock:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(text)
                f.flush()

    # ---- batched generation -----------------------------------------------------------
    def _submit(self, job: _Job) -> None:
        with self._queue_cv:
            if self._stopping or self._batcher is None:
                raise RuntimeError("the policy endpoint is stopped")
            self._queue.append(job)
            self._last_arrival = time.monotonic()
            # wake the batcher only where its decision can change (the first job, a full batch;
            # `_arrival` wakes it once every connection's request is in): a wake-up takes the GIL
            # from the event loop
            if len(self._queue) == 1 or len(self._queue) >= self.max_batch:
                self._queue_cv.notify_all()

    def _take_batch(self) -> list[_Job] | None:
        """Queued jobs once no more can be expected soon; None when stopping. The batch closes at
        `max_batch` rows, after `batch_wait_s` in all, as soon as every request is in (`_all_in`),
        or once arrivals pause for `batch_window_s` with no request being rendered."""
        with self._queue_cv:
            while not self._queue and not self._stopping:
                self._queue_cv.wait()
            if self._stopping:
                return None
            start = time.monotonic()
            while len(self._queue) < self.max_batch and not self._all_in():
                now = time.monotonic()
                if now >= start + self.batch_wait_s:
                    break
                deadline = max(self._last_arrival, start) + self.batch_window_s
                if now >= deadline:
                    if self._arriving == 0:
                        break
                    # a request is being rendered: worth another window (at least 1 ms: no spinning)
                    deadline = now + max(self.batch_window_s, 0.001)
                self._queue_cv.wait(min(deadline, start + self.batch_wait_s) - now)
            self.stats["wait_s"] += time.monotonic() - start
            self.stats["closed_all_in"] += int(self._all_in())
            return [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]

    def _open_connections(self) -> float:
        """The server's open HTTP connections (uvicorn's count; infinity where it has none, so
        that only the window closes a batch)."""
        state = getattr(self._server, "server_state", None)
        return len(state.connections) if state is not None else float("inf")

    def _all_in(self) -> bool:
        """Whether no more requests can be expected for the batch being gathered: none is being
        rendered, every open connection has one queued, and none of those is the first on its
        connection (its client may be opening more). The caller holds the queue lock."""
        return (self._arriving == 0 and len(self._queue) >= self._open_connections()
                and not any(j.fresh for j in self._queue))

    def _arrival(self, delta: int) -> None:
        with self._queue_cv:
            self._arriving += delta
            if self._queue and self._all_in():   # the batcher's timed waits cover every other case
                self._queue_cv.notify_all()

    def _batch_loop(self) -> None:
        while (jobs := self._take_batch()) is not None:
            kinds: dict[tuple[int, float, tuple[str, ...]], list[_Job]] = {}
            for j in jobs:
                kinds.setdefault((j.max_new, j.temperature, j.stop), []).append(j)
            for (max_new, temperature, stop), group in kinds.items():
                try:
                    prompts = [j.prompt for j in group]
                    t0 = time.perf_counter()
                    outs, lps = generate_rows(self.policy, prompts, max_new, temperature, list(stop))
                    self.stats["generate_s"] += time.perf_counter() - t0
                    self.stats["batches"] += 1
                    self.stats["rows"] += len(group)
                    t0 = time.perf_counter()
                    version = self.harness.version   # a hash of the harness: once per batch
                    with self._state_lock:
                        done = [self._finish(j, outs[k], lps[k] if lps is not None else None, version)
                                for k, j in enumerate(group)]
                    # one write per batch, before any answer: a client that reads the log once
                    # answered finds its call there
                    self._append(*(record for _, record in done))
                    self.stats["record_s"] += time.perf_counter() - t0
                except Exception as e:   # the policy failed: every request of the batch gets it
                    _deliver([(j, False, e) for j in group])
                    continue
                _deliver([(j, True, response) for j, (response, _) in zip(group, done)])
        with self._queue_cv:   # stopped: nothing queued is left waiting
            left = list(self._queue)
            self._queue.clear()
        _deliver([(j, False, RuntimeError("the policy endpoint stopped")) for j in left])

    # ---- rendering --------------------------------------------------------------------
    def _canonical(self, content: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return content + "".join(self.harness.tool_syntax.render(n, a) for n, a in calls)

    def render(self, messages: list[dict[str, Any]], tools: list[ToolSpec] | None, ep: _Episode
               ) -> tuple[list[int], int, int]:
        """Prompt ids for `messages`, and how many assistant messages were reused as generated
        ids / re-encoded from text. ValueError for a message the harness cannot render."""
        h, tok = self.harness, self.policy.tok
        shown_tools = tools if tools is not None else h.tools
        msgs = list(messages)
        if not any(m.get("role") in ("system", "developer") for m in msgs):
            msgs.insert(0, {"role": "system", "content": h.system_prompt.format(
                tools=describe_tools(shown_tools, h.tool_syntax))})
        elif tools:
            first = next(i for i, m in enumerate(msgs) if m.get("role") in ("system", "developer"))
            msgs[first] = {**msgs[first], "content": _text(msgs[first].get("content"), first) + "\n"
                           + describe_tools(tools, h.tool_syntax)}
        ids = [tok.bos_id]
        reused = retok = 0
        for i, m in enumerate(msgs):
            role = m.get("role")
            role = "system" if role == "developer" else role
            if role not in ("system", "user", "assistant", "tool"):
                raise ValueError(f"messages[{i}].role={role!r} must be system, developer, user, assistant or tool")
            prefix, suffix = h.template.parts(role)
            content = _text(m.get("content"), i)
            if role == "assistant":
                calls = []
                for c in m.get("tool_calls") or []:
                    fn = (c or {}).get("function") or {}
                    try:
                        args = json.loads(fn.get("arguments") or "{}")
                    except ValueError:
                        raise ValueError(f"messages[{i}].tool_calls: arguments are not JSON") from None
                    if not isinstance(fn.get("name"), str) or not isinstance(args, dict):
                        raise ValueError(f"messages[{i}].tool_calls: a call needs a name and object arguments")
                    calls.append((fn["name"], args))
                text = self._canonical(content, calls)
                body = ep.produced.get(text)
                if body is None:
                    body, retok = tok.encode(text), retok + 1
                else:
                    reused += 1
            else:
                if role == "tool":
                    content = h.observation.apply(content)[0]
                body = tok.encode(content)
            ids += tok.encode(prefix) + body + tok.encode(suffix)
        return ids + tok.encode(h.template.parts("assistant")[0]), reused, retok

    # ---- the app ----------------------------------------------------------------------
    def _make_app(self) -> Any:
        """The ASGI app uvicorn serves: every HTTP request needs the token, a chat completion goes
        straight to `_chat`, anything else to a FastAPI app (the reward route, and OpenAI-style
        errors for unknown paths, wrong methods and invalid requests). Plain ASGI in front, not
        FastAPI middleware: see the module docstring."""
        from fastapi import FastAPI
        from fastapi.exceptions import RequestValidationError
        from starlette.exceptions import HTTPException

        api = FastAPI(title="swarmlab policy endpoint", docs_url=None, redoc_url=None, openapi_url=None)

        @api.exception_handler(RequestValidationError)
        async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
            first = exc.errors()[0] if exc.errors() else {}
            loc = ".".join(str(x) for x in first.get("loc", ())[1:])
            return _error(400, f"{loc or 'body'}: {first.get('msg', 'invalid request')}", param=loc or None)

        @api.exception_handler(HTTPException)
        async def _http(request: Request, exc: HTTPException) -> JSONResponse:
            return _error(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)

        @api.post("/v1/episodes/{episode}/reward")
        async def reward(episode: str, request: Request) -> JSONResponse:
            try:
                body = await request.json()
            except ValueError:
                return _error(400, "the body is not JSON")
            value = body.get("reward") if isinstance(body, dict) else None
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
                return _error(400, f"reward={value!r} must be a number", param="reward")
            self._append({"type": "reward", "episode": episode, "reward": float(value), "time": time.time(),
                          "harness_version": self.harness.version, "weight_version": self.weight_version})
            return JSONResponse({"ok": True})

        # the chat route as FastAPI knows it, so that other methods on its path get a 405; the
        # front serves a POST itself
        api.router.add_route(CHAT_PATH, _AsgiRoute(self._chat), methods=["POST"])
        want = ("Bearer " + self.token).encode()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":   # no websockets (lifespan is off): nothing else is served
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                return
            got = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(got, want):
                await _error(401, "a valid bearer token is required", kind="authentication_error",
                             code="invalid_api_key")(scope, receive, send)
                return
            if scope["path"] == CHAT_PATH and scope["method"] == "POST":
                await self._chat(scope, receive, send)
                return
            await api(scope, receive, send)

        return app

    async def _chat(self, scope: Any, receive: Any, send: Any) -> None:
        """POST /v1/chat/completions: read, check and render the request here, in the event loop;
        the batcher generates it with the other queued requests and resolves its future."""
        self._arrival(+1)   # the batcher waits for a request it knows is on its way
        try:
            got = await self._read_job(scope, receive)
        finally:
            self._arrival(-1)
        if got is None:   # the client went away before its request was in
            return
        response = got if isinstance(got, JSONResponse) else JSONResponse(await got)
        await response(scope, receive, send)

    async def _read_job(self, scope: Any, receive: Any) -> JSONResponse | asyncio.Future | None:
        """The request queued for the batcher (its future), an error response, or None when the
        client disconnected while sending it."""
        chunks, more, size = [], True, 0
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > MAX_BODY_BYTES:
                return _error(413, f"the request body is over {MAX_BODY_BYTES} bytes")
            more = message.get("more_body", False)
        try:
            body = json.loads(b"".join(chunks))
        except ValueError:
            return _error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        episode = _header(scope, EPISODE_HEADER) or body.get("user") or "default"
        try:
            job = self._prepare(body, str(episode), _header(scope, ATTEMPT_HEADER))
        except ValueError as e:
            return _error(400, str(e))
        except (TypeError, AttributeError, KeyError) as e:   # a field of the wrong JSON type somewhere inside
            return _error(400, f"the request does not have the shape of a chat completion: {type(e).__name__}: {e}")
        if len(self._clients) > 4096:   # bounded; a forgotten connection only looks fresh again
            self._clients.clear()
        peer = scope.get("client")
        job.fresh = peer not in self._clients
        self._clients.add(peer)
        job.loop = asyncio.get_running_loop()
        job.done = job.loop.create_future()
        self._submit(job)
        return job.done

    def _prepare(self, body: dict[str, Any], episode: str, attempt: str | None = None) -> _Job:
        """A request checked and rendered (ValueError: a bad request)."""
        h = self.harness
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or len(messages) > MAX_BODY_MESSAGES:
            raise ValueError(f"messages must be a non-empty list of at most {MAX_BODY_MESSAGES} messages")
        if any(not isinstance(m, dict) for m in messages):
            raise ValueError("every message must be an object")
        if body.get("stream"):
            raise ValueError("stream=true is not supported by this endpoint")
        if body.get("n", 1) != 1:
            raise ValueError(f"n={body.get('n')!r}: this endpoint returns one choice")
        tools = None
        if body.get("tools") is not None:
            try:
                tools = [ToolSpec(name=t["function"]["name"], description=t["function"].get("description", ""),
                                  parameters=t["function"].get("parameters") or {"type": "object", "properties": {}})
                         for t in body["tools"]]
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"tools: {str(e).splitlines()[0]}") from None
        max_new = h.sampling.max_new_tokens
        asked = body.get("max_completion_tokens", body.get("max_tokens"))
        if asked is not None:
            if not isinstance(asked, int) or isinstance(asked, bool) or asked < 1:
                raise ValueError(f"max_tokens={asked!r} must be a positive integer")
            max_new = min(max_new, asked)
        with self._state_lock:
            ep = self.episodes.setdefault(episode, _Episode())
            prompt, reused, retok = self.render(messages, tools, ep)
        limit = getattr(self.policy, "max_len", None)
        if limit is not None and len(prompt) + 1 > limit:
            raise ValueError(f"the prompt is {len(prompt)} tokens; the policy takes at most {limit}")
        if limit is not None:
            max_new = min(max_new, limit - len(prompt))
        return _Job(body, episode, attempt, ep, tools, prompt, reused, retok, max_new, h.sampling.temperature,
                    tuple(h.stop))

    def _finish(self, job: _Job, out: list[int], logprobs: list[float] | None, version: str
                ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The response and the log record of `job`'s completion `out`; updates its episode (the
        caller holds the state lock)."""
        h, tok = self.harness, self.policy.tok
        body, ep, tools, prompt, max_new = job.body, job.ep, job.tools, job.prompt, job.max_new
        extends = ep.last is None or prompt[: len(ep.last)] == ep.last
        ep.last = prompt + out
        ep.calls += 1
        text = tok.decode(out)
        # `out` is already cut at its first stop string (`generate_rows`): it stopped if one is in it
        stopped = any(s and s in text for s in h.stop) or (bool(out) and out[-1] == tok.eos_id) or len(out) < max_new
        at = h.tool_syntax.find(text)
        parsed = h.tool_syntax.parse(text, tools if tools is not None else h.tools) if at >= 0 else None
        answer_at = text.find(h.answer.prefix) if h.answer.prefix else -1
        tool_calls = None
        content: str | None = text
        if isinstance(parsed, ToolCall) and not (0 <= answer_at < at):
            content = text[:at]
            call_id = f"call_{secrets.token_hex(6)}"
            tool_calls = [{"id": call_id, "type": "function",
                           "function": {"name": parsed.name, "arguments": json.dumps(parsed.arguments)}}]
            ep.produced[self._canonical(content, [(parsed.name, parsed.arguments)])] = out
            finish = "tool_calls"
        else:
            ep.produced[text] = out
            finish = "stop" if stopped else "length"
        messages = body["messages"]
        record = {
            "type": "call", "episode": job.episode, "attempt": job.attempt, "call": ep.calls, "time": time.time(),
            "harness_version": version, "weight_version": self.weight_version,
            "messages": messages, "tools": body.get("tools"),
            "requested": {k: body.get(k) for k in ("model", "temperature", "top_p", "max_tokens",
                                                   "max_completion_tokens") if k in body},
            "prompt_ids": prompt, "completion_ids": out, "logprobs": logprobs, "text": text,
            "finish_reason": finish, "tool_calls": tool_calls,
            "malformed_call": parsed.reason if isinstance(parsed, Malformed) else None,
            "extends_previous": extends, "reused_assistant": job.reused, "retokenized_assistant": job.retok,
        }
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish,
                                  "message": {"role": "assistant", "content": (content or None) if tool_calls else content,
                                              "tool_calls": tool_calls}}
        if body.get("logprobs") and logprobs is not None:
            choice["logprobs"] = {"content": [
                {"token": tok.decode([t]), "logprob": lp, "bytes": list(tok.decode([t]).encode()), "top_logprobs": []}
                for t, lp in zip(out, logprobs)]}
        return {
            "id": f"chatcmpl-{secrets.token_hex(8)}", "object": "chat.completion", "created": int(time.time()),
            "model": self.model_name, "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out),
                      "total_tokens": len(prompt) + len(out)},
            "system_fingerprint": version,
        }, record


class _AsgiRoute:
    """An ASGI callable that starlette routes to as it is (a function or method would be wrapped
    as a request handler)."""

    def __init__(self, fn: Callable[[Any, Any, Any], Awaitable[None]]) -> None:
        self.fn = fn

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.fn(scope, receive, send)


def _deliver(results: list[tuple[_Job, bool, Any]]) -> None:
    """Hands each (job, ok, response or exception) to the event loop awaiting it: one wake-up of
    each loop for a whole batch (a wake-up per answer costs a GIL handoff per answer)."""
    by_loop: dict[Any, list[tuple[asyncio.Future, bool, Any]]] = {}
    for job, ok, value in results:
        if job.done is not None:
            by_loop.setdefault(job.loop, []).append((job.done, ok, value))
    for loop, answers in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve, answers)
        except RuntimeError:   # the loop is closed (the server stopped): nobody awaits these
            pass


def _resolve(answers: list[tuple[asyncio.Future, bool, Any]]) -> None:
    for done, ok, value in answers:
        if done.done():   # the request was cancelled (its client went away); the call is logged all the same
            continue
        if ok:
            done.set_result(value)
        else:
            done.set_exception(value)


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
           code: str | None = None) -> JSONResponse:
    """An OpenAI-style error response."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status)


def _header(scope: Any, name: bytes) -> str | None:
    """The first value of a request header (`name` lower-case), as starlette decodes it."""
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), None)


def _text(content: Any, i: int) -> str:
    """A message's content as text: a string, None, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise ValueError(f"messages[{i}].content: only text parts are supported")
            parts.append(p["text"])
        return "".join(parts)
    raise ValueError(f"messages[{i}].content must be a string or a list of text parts")


def read_log(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """The records of a trajectory log, in order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
