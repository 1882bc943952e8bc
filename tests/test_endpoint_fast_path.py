"""The policy endpoint's plain-ASGI front (trainer/endpoint.py): chat completions skip FastAPI,
everything else still gets FastAPI's routing with OpenAI-style errors behind the token; a client
that goes away mid-request leaves no request counted as arriving; a batch's answers wake each
event loop once. A real server on loopback with a scripted policy (tests/test_agent_fakes.py)."""
from __future__ import annotations

import asyncio
import socket
import time

import httpx
import openai
import pytest

from test_agent_fakes import ScriptedPolicy
from trainer.endpoint import MAX_BODY_BYTES, EndpointServer, _deliver, _Episode, _Job, _resolve, read_log
from trainer.envs import make_env


@pytest.fixture
def harness():
    return make_env("lookup").default_harness(sampling={"temperature": 0.7, "max_new_tokens": 48})


def test_other_paths_and_methods_get_openai_errors_behind_the_token(tmp_path, harness):
    with EndpointServer(ScriptedPolicy([]), harness, tmp_path / "l.jsonl") as srv:
        auth = {"Authorization": f"Bearer {srv.token}"}
        r = httpx.get(srv.url + "/v1/chat/completions", headers=auth)
        assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error", r.text
        r = httpx.post(srv.url + "/v1/nothing", json={}, headers=auth)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
        for method, path in [("GET", "/v1/nothing"), ("GET", "/v1/chat/completions")]:
            r = httpx.request(method, srv.url + path)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (method, path)
        r = httpx.post(srv.url + "/v1/chat/completions", content=b"[1, 2]", headers=auth)
        assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
        # a field of the wrong JSON type deep inside is the client's error, answered as one
        bad = {"model": "p", "messages": [{"role": "assistant", "content": "", "tool_calls": ["s"]}]}
        r = httpx.post(srv.url + "/v1/chat/completions", json=bad, headers=auth)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
        r = httpx.post(srv.url + "/v1/chat/completions", content=b" " * (MAX_BODY_BYTES + 1), headers=auth)
        assert r.status_code == 413 and "over" in r.json()["error"]["message"]


def test_a_client_gone_before_its_body_is_in_leaves_nothing_arriving(tmp_path, harness):
    """Headers sent, half a body, then the connection closes: the request is dropped unanswered
    and unlogged, and a later request on a known connection still closes its batch at once
    (a request left counted as arriving would hold every batch for the window)."""
    outputs = ["<answer>1</answer>", "<answer>2</answer>"]
    with EndpointServer(ScriptedPolicy(outputs), harness, tmp_path / "l.jsonl", batch_window_s=0.3,
                        batch_wait_s=0.6) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + srv.token.encode()
                      + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"messages\": [")
            deadline = time.time() + 10
            while srv._arriving == 0 and time.time() < deadline:   # the request is being read
                time.sleep(0.01)
            assert srv._arriving == 1
        deadline = time.time() + 10
        while srv._arriving and time.time() < deadline:
            time.sleep(0.01)
        assert srv._arriving == 0, "a request whose client went away still counts as arriving"
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.token, max_retries=0, timeout=30)
        for user in ("a", "b"):   # "a" opens the connection (the window closes its batch), "b" reuses it
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}], user=user)
        assert srv.stats["batches"] == 2 and srv.stats["closed_all_in"] == 1, srv.stats
    assert [r["episode"] for r in read_log(tmp_path / "l.jsonl")] == ["a", "b"]


def test_the_peer_is_the_socket_not_a_forwarded_for_header(tmp_path, harness):
    """Which connections have sent a request decides when a batch closes: a client cannot pose as
    another peer with X-Forwarded-For."""
    with EndpointServer(ScriptedPolicy(["<answer>1</answer>"]), harness, tmp_path / "l.jsonl") as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "q"}]},
                       headers={"Authorization": f"Bearer {srv.token}", "X-Forwarded-For": "10.1.2.3"})
        assert r.status_code == 200, r.text
        assert [host for host, _ in srv._clients] == ["127.0.0.1"]


class RecordingLoop:
    """Stands in for an event loop: records what is handed to it; a closed one refuses."""

    def __init__(self, closed: bool = False) -> None:
        self.calls: list[tuple] = []
        self.closed = closed

    def call_soon_threadsafe(self, fn, *args):
        if self.closed:
            raise RuntimeError("Event loop is closed")
        self.calls.append((fn, *args))


def _job(loop, done) -> _Job:
    return _Job(body={}, episode="e", attempt=None, ep=_Episode(), tools=None, prompt=[1], reused=0, retok=0,
                max_new=4, temperature=1.0, stop=(), loop=loop, done=done)


def test_a_batch_wakes_each_event_loop_once():
    futures_loop = asyncio.new_event_loop()
    try:
        a, b, gone = RecordingLoop(), RecordingLoop(), RecordingLoop(closed=True)
        fa = [futures_loop.create_future() for _ in range(3)]
        fb, fg = futures_loop.create_future(), futures_loop.create_future()
        fa[2].cancel()   # its client went away
        boom = ValueError("boom")
        _deliver([(_job(a, fa[0]), True, {"x": 0}), (_job(b, fb), False, boom), (_job(a, fa[1]), True, {"x": 1}),
                  (_job(gone, fg), True, {}), (_job(a, fa[2]), True, {"x": 2}), (_job(None, None), True, {})])
        assert [len(loop.calls) for loop in (a, b)] == [1, 1]   # one wake-up per loop, the closed one skipped
        for loop in (a, b):
            fn, answers = loop.calls[0]
            assert fn is _resolve
            fn(answers)
        assert [f.result() for f in fa[:2]] == [{"x": 0}, {"x": 1}] and fa[2].cancelled()
        assert fb.exception() is boom and not fg.done()
    finally:
        futures_loop.close()
