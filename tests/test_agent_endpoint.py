"""The OpenAI-compatible policy endpoint (trainer/endpoint.py) through the real `openai` client on
loopback, with a scripted policy (tests/test_agent_fakes.py): bearer-token auth, tool calls in the
OpenAI format, harness-enforced sampling, OpenAI-style error bodies, and the JSONL trajectory log
(exact token ids, assistant turns reused as generated, episodes, rewards)."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from harness.tools import ToolSpec, params
from test_agent_fakes import ScriptedPolicy
from trainer.endpoint import EndpointServer, read_log
from trainer.envs import make_env

TOOLS = [{"type": "function", "function": {"name": "get", "description": "the value of a key",
                                           "parameters": params(key="string")}}]


@pytest.fixture
def harness():
    return make_env("lookup").default_harness(sampling={"temperature": 0.7, "max_new_tokens": 48})


@pytest.fixture
def serve(tmp_path, harness):
    servers = []

    def start(outputs, **kw):
        policy = ScriptedPolicy(outputs, logprob=-0.5)
        srv = EndpointServer(policy, harness, tmp_path / "log.jsonl", weight_version="w1", **kw).start()
        servers.append(srv)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.token, max_retries=0, timeout=30)
        return srv, policy, client

    yield start
    for s in servers:
        s.stop()


def test_token_is_required(serve):
    srv, policy, _ = serve(["x"])
    assert srv.url.startswith("http://127.0.0.1:")
    bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong-token-wrong-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 401
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.post(srv.url + "/v1/episodes/e/reward", json={"reward": 1}).status_code == 401
    assert policy.calls == [], "nothing is generated for an unauthenticated request"


def test_an_episode_with_a_tool_call_is_logged_with_exact_ids(serve, harness, tmp_path):
    srv, policy, client = serve(['<tool>get(key="abc")</tool>', "<answer>42</answer>"])
    messages = [{"role": "system", "content": "Find values."}, {"role": "user", "content": "What is abc?"}]
    r1 = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, user="ep-1",
                                        temperature=1.9)
    choice = r1.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name == "get" and json.loads(call.function.arguments) == {"key": "abc"}
    assert r1.system_fingerprint == harness.version
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    r2 = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, user="ep-1", logprobs=True)
    assert r2.choices[0].message.content == "<answer>42</answer>" and r2.choices[0].finish_reason == "stop"
    assert [x.logprob for x in r2.choices[0].logprobs.content] == [-0.5] * len("<answer>42</answer>")
    assert r2.usage.completion_tokens == len("<answer>42</answer>")
    # sampling comes from the harness, not the client
    assert [c["temperature"] for c in policy.calls] == [0.7, 0.7]
    assert policy.calls[0]["stop"] == harness.stop
    log = read_log(tmp_path / "log.jsonl")
    assert [(r["type"], r["episode"], r["call"]) for r in log] == [("call", "ep-1", 1), ("call", "ep-1", 2)]
    a, b = log
    tok = policy.tok
    assert a["prompt_ids"] == policy.calls[0]["prompt_ids"] and b["prompt_ids"] == policy.calls[1]["prompt_ids"]
    assert a["completion_ids"] == tok.encode('<tool>get(key="abc")</tool>')
    assert b["prompt_ids"][: len(a["prompt_ids"]) + len(a["completion_ids"])] == a["prompt_ids"] + a["completion_ids"]
    assert b["extends_previous"] and b["reused_assistant"] == 1 and b["retokenized_assistant"] == 0
    assert a["logprobs"] == [-0.5] * len(a["completion_ids"]) and a["finish_reason"] == "tool_calls"
    assert a["harness_version"] == harness.version and a["weight_version"] == "w1"
    assert a["requested"]["temperature"] == 1.9 and a["messages"] == messages[:2]
    prompt = tok.decode(a["prompt_ids"])
    assert prompt.startswith("Find values.\nTools:\n- get(key: string): the value of a key") and prompt.endswith(
        "Q: What is abc?\nA: ")
    assert tok.decode(b["prompt_ids"]).endswith('A: <tool>get(key="abc")</tool>\nT: 42\nA: ')


def test_an_assistant_turn_the_client_changed_is_reencoded_and_counted(serve, tmp_path):
    srv, policy, client = serve(["<answer>1</answer>", "<answer>2</answer>"])
    msgs = [{"role": "user", "content": "q"}]
    client.chat.completions.create(model="policy", messages=msgs, extra_headers={"X-Episode-Id": "h"}, user="u")
    msgs += [{"role": "assistant", "content": "<answer>one</answer>"}, {"role": "user", "content": "again"}]
    client.chat.completions.create(model="policy", messages=msgs, extra_headers={"X-Episode-Id": "h"})
    a, b = read_log(tmp_path / "log.jsonl")
    assert a["episode"] == b["episode"] == "h", "the header wins over the user field"
    assert b["reused_assistant"] == 0 and b["retokenized_assistant"] == 1 and not b["extends_previous"]
    # no system message from the client: the harness's system prompt with its tool list
    assert policy.tok.decode(a["prompt_ids"]).startswith("Answer the question. You may call tools.\nTools:\n- get(")


def test_max_tokens_can_only_shorten_a_turn(serve, tmp_path):
    srv, policy, client = serve(["<answer>12345</answer>", "<answer>1</answer>"])
    r = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}], max_tokens=5)
    assert r.choices[0].message.content == "<answ" and r.choices[0].finish_reason == "length"
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}], max_tokens=4000)
    assert [c["max_new_tokens"] for c in policy.calls] == [5, 48]


@pytest.mark.parametrize("body,message", [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": ["hi"]}, "object"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "role='wizard'"),
    ({"messages": [{"role": "user", "content": 5}]}, "content"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": True}, "stream"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "one choice"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "1bad"}}]}, "tools"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get",
                                                                                      "arguments": "{x"}}]}]}, "JSON"),
])
def test_malformed_requests_get_openai_error_bodies(serve, body, message, tmp_path):
    srv, policy, client = serve([])
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {srv.token}"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and message in err["message"]
    assert policy.calls == [] and not (tmp_path / "log.jsonl").exists()


def test_the_openai_client_sees_bad_requests_as_errors(serve):
    srv, _, client = serve([])
    with pytest.raises(openai.BadRequestError, match="stream"):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}], stream=True)
    r = httpx.post(srv.url + "/v1/chat/completions", content=b"{not json",
                   headers={"Authorization": f"Bearer {srv.token}", "Content-Type": "application/json"})
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]


def test_rewards_are_appended_and_the_log_survives_a_restart(serve, tmp_path):
    srv, _, client = serve(["<answer>1</answer>"])
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}], user="e1")
    auth = {"Authorization": f"Bearer {srv.token}"}
    assert httpx.post(srv.url + "/v1/episodes/e1/reward", json={"reward": 0.75}, headers=auth).status_code == 200
    assert httpx.post(srv.url + "/v1/episodes/e1/reward", json={"reward": "high"}, headers=auth).status_code == 400
    srv.stop()
    srv2, _, client2 = serve(["<answer>2</answer>"])
    client2.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}], user="e2")
    log = read_log(tmp_path / "log.jsonl")
    assert [(r["type"], r["episode"]) for r in log] == [("call", "e1"), ("reward", "e1"), ("call", "e2")]
    assert log[1]["reward"] == 0.75 and srv2.token != srv.token


def test_a_too_long_prompt_is_refused(serve, harness, tmp_path):
    srv, policy, client = serve([])
    policy.max_len = 64
    with pytest.raises(openai.BadRequestError, match="the policy takes at most 64"):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q" * 100}])


def test_token_must_be_long(tmp_path, harness):
    with pytest.raises(ValueError, match="at least 16"):
        EndpointServer(ScriptedPolicy([]), harness, tmp_path / "x.jsonl", token="short")
    assert ToolSpec(**TOOLS[0]["function"]).openai() == TOOLS[0]


def test_the_built_in_model_behind_the_endpoint(tmp_path):
    import torch

    from trainer.agent_rollout import PolicyGenerator
    from trainer.config import ModelConfig
    from trainer.policy import Policy

    policy = Policy.build(ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=512), seed=0)
    gen = PolicyGenerator(policy, generator=torch.Generator().manual_seed(0))
    harness = make_env("lookup").default_harness(sampling={"max_new_tokens": 10})
    with EndpointServer(gen, harness, tmp_path / "log.jsonl") as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.token, max_retries=0, timeout=60)
        r = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "What is abc?"}],
                                           tools=TOOLS, user="e")
    rec = read_log(tmp_path / "log.jsonl")[0]
    ids, comp, lps = rec["prompt_ids"], rec["completion_ids"], rec["logprobs"]
    assert 1 <= len(comp) <= 10 and len(lps) == len(comp) and r.usage.completion_tokens == len(comp)
    # reference: the model's own next-token log-softmax over the whole sequence
    with torch.no_grad():
        seq = torch.tensor([ids + comp])
        logits = policy.model.lm_head(policy.model(seq, attention_mask=torch.ones_like(seq)))
        ref = torch.log_softmax(logits[0, len(ids) - 1: -1].float(), -1).gather(-1, torch.tensor(comp)[:, None])
    assert torch.allclose(torch.tensor(lps), ref[:, 0], atol=1e-4)


class SlowPolicy(ScriptedPolicy):
    def generate(self, *args, **kw):
        import time

        time.sleep(1.0)
        return super().generate(*args, **kw)


def test_a_client_that_disconnects_mid_call_loses_nothing(tmp_path, harness):
    with EndpointServer(SlowPolicy(["<answer>1</answer>", "<answer>2</answer>"]), harness, tmp_path / "l.jsonl") as srv:
        impatient = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.token, max_retries=0, timeout=0.2)
        with pytest.raises(openai.APITimeoutError):
            impatient.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}], user="e",
                                              extra_headers={"X-Attempt": "1"})
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.token, max_retries=0, timeout=30)
        r = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}], user="e",
                                           extra_headers={"X-Attempt": "2"})
        assert r.choices[0].message.content == "<answer>2</answer>"
    log = read_log(tmp_path / "l.jsonl")
    assert [(r["episode"], r["attempt"], r["text"]) for r in log] == [("e", "1", "<answer>1</answer>"),
                                                                      ("e", "2", "<answer>2</answer>")]


def test_concurrent_requests_are_generated_in_one_batch(tmp_path):
    """Requests sent at once meet in one `Policy.generate` call; each gets its own row, its
    log-probs equal the model's own (one-row reference) and its prompt the ids rendered for it."""
    import asyncio

    import torch

    from trainer.agent_rollout import PolicyGenerator
    from trainer.config import ModelConfig
    from trainer.policy import Policy

    policy = Policy.build(ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=512), seed=0)
    gen = PolicyGenerator(policy, generator=torch.Generator().manual_seed(0))
    harness = make_env("lookup").default_harness(sampling={"max_new_tokens": 12})
    questions = [f"What is {k}?" + "?" * (3 * i) for i, k in enumerate(["abc", "k1", "zz", "long-key", "q"])]
    # a window long enough that a loaded machine still gathers the five requests
    with EndpointServer(gen, harness, tmp_path / "log.jsonl", batch_window_s=0.2, batch_wait_s=1.0) as srv:
        async def all_at_once():
            async with openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=srv.token, max_retries=0,
                                          timeout=60) as client:
                return await asyncio.gather(*(client.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": q}], tools=TOOLS, user=f"e{i}")
                    for i, q in enumerate(questions)))

        rs = asyncio.run(all_at_once())
        assert srv.stats["batches"] == 1 and srv.stats["rows"] == 5, srv.stats
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.token, max_retries=0, timeout=60)
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}], user="alone")
        assert srv.stats["batches"] == 2 and srv.stats["rows"] == 6      # a lone request is a batch of one
    recs = {r["episode"]: r for r in read_log(tmp_path / "log.jsonl")}
    for i, (q, r) in enumerate(zip(questions, rs)):
        rec = recs[f"e{i}"]
        assert rec["messages"][-1]["content"] == q and r.usage.completion_tokens == len(rec["completion_ids"])
        assert r.usage.prompt_tokens == len(rec["prompt_ids"]) and len(rec["logprobs"]) == len(rec["completion_ids"])
        if rec["completion_ids"]:
            ref = gen.logprobs(rec["prompt_ids"], rec["completion_ids"])
            assert torch.allclose(torch.tensor(rec["logprobs"]), torch.tensor(ref), atol=1e-4)
    assert len({len(recs[f"e{i}"]["prompt_ids"]) for i in range(5)}) == 5   # rows of different lengths, padded


def test_batch_settings_are_checked(tmp_path, harness):
    with pytest.raises(ValueError, match="max_batch=0"):
        EndpointServer(ScriptedPolicy([]), harness, tmp_path / "l.jsonl", max_batch=0)
    with pytest.raises(ValueError, match="batch_window_s=0.5"):
        EndpointServer(ScriptedPolicy([]), harness, tmp_path / "l.jsonl", batch_window_s=0.5, batch_wait_s=0.1)


def test_a_batch_closes_once_every_connection_has_a_request_queued(tmp_path, harness):
    """A lone client's request is its connection's only one: the batch closes at once, not after
    the window; but not on a new connection (its client may be opening more), nor while another
    connection is open and idle (it may still bring a request)."""
    outputs = ["<answer>1</answer>", "<answer>2</answer>", "<answer>3</answer>"]
    with EndpointServer(ScriptedPolicy(outputs), harness, tmp_path / "l.jsonl", batch_window_s=0.3,
                        batch_wait_s=0.6) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.token, max_retries=0, timeout=30)
        early = []     # did each batch close because every request was in (not by the window)?
        for user in ("a", "b"):
            before = srv.stats["closed_all_in"]
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}], user=user)
            early.append(srv.stats["closed_all_in"] - before)
        with httpx.Client(headers={"Authorization": f"Bearer {srv.token}"}) as idle:   # a second, idle connection
            assert idle.post(srv.url + "/v1/episodes/a/reward", json={"reward": 1}).status_code == 200
            before = srv.stats["closed_all_in"]
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}], user="c")
            early.append(srv.stats["closed_all_in"] - before)
        assert srv.stats["batches"] == 3, srv.stats
    assert early == [0, 1, 0], early
    assert [r["type"] for r in read_log(tmp_path / "l.jsonl")] == ["call", "call", "reward", "call"]


def test_every_call_of_a_batch_is_logged_before_its_answers(tmp_path):
    """Concurrent calls: each answer's log line is on disk when the client gets the answer, and
    all of them after a shutdown."""
    import asyncio

    harness = make_env("lookup").default_harness(sampling={"max_new_tokens": 20})
    outputs = [f"<answer>{i}</answer>" for i in range(6)]
    log = tmp_path / "l.jsonl"
    with EndpointServer(ScriptedPolicy(outputs), harness, log, batch_window_s=0.2, batch_wait_s=1.0) as srv:
        async def call(client, i):
            r = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": f"q{i}"}],
                                                     user=f"e{i}")
            return {rec["episode"] for rec in read_log(log)}, r

        async def all_at_once():
            async with openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=srv.token, max_retries=0,
                                          timeout=60) as client:
                return await asyncio.gather(*(call(client, i) for i in range(6)))

        got = asyncio.run(all_at_once())
    for i, (logged, r) in enumerate(got):
        assert f"e{i}" in logged, f"call e{i} answered before its log line was written"
    recs = read_log(log)
    assert sorted(r["episode"] for r in recs) == [f"e{i}" for i in range(6)]
    assert sorted(r["text"] for r in recs) == sorted(outputs)
