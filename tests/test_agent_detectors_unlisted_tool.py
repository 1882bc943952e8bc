"""The critic (`harness.critic.diagnose`, read by the swarm's `agent_unknown_tool`) on a tool the
environment declares (`env_tools`) and the harness does not list, from real lookup episodes played
by a scripted policy: a policy that is not told of the tool stops calling it, and its failed
episodes that never call the tool are the evidence; calls of it refused as unknown are too. A tool
the solved episodes do without as often is not what failed the others.
"""
from __future__ import annotations

import pytest

from harness.agent import apply_edit
from harness.critic import Mode, critique
from test_agent_fakes import ScriptedPolicy
from trainer.agent_rollout import run_episode
from trainer.envs import make_env


@pytest.fixture
def env():
    return make_env("lookup", seed=0)


def run(env, harness, script, n: int = 4, first: int = 0):
    exs = [env.episode("train", i, 1) for i in range(first, first + n)]
    return [run_episode(ScriptedPolicy(script(ex)), env, ex, harness) for ex in exs]


def test_failed_episodes_that_never_call_an_unlisted_tool_restore_its_spec(env):
    h = env.default_harness(tools=[])
    crit = critique(run(env, h, lambda ex: ["<answer>12</answer>"]), h, env.tool_specs())
    assert [(f.mode, f.count) for f in crit.findings] == [(Mode.UNKNOWN_TOOL, 4)]
    f = crit.findings[0]
    assert f.detail == {"calls": 0, "unused": 4, "names": {"get": 4}}
    assert "0 calls refused as unknown and 4 failed episodes that never called them" in f.evidence
    assert [e.text() for e in crit.edits] == [f"tools.get={env.tool_specs()[0].model_dump(mode='json')!r}"]
    assert apply_edit(h, crit.edits[0].path, crit.edits[0].value).tools == env.tool_specs()


def test_calls_refused_as_unknown_and_episodes_without_them_add_up(env):
    h = env.default_harness(tools=[])
    calls = run(env, h, lambda ex: [f'<tool>get(key="{ex.meta["asked"][0]}")</tool>', "<answer>0</answer>"], n=2)
    none = run(env, h, lambda ex: ["<answer>0</answer>"], n=3, first=2)
    crit = critique(calls + none, h, env.tool_specs())
    assert crit.findings[0].mode is Mode.UNKNOWN_TOOL and crit.findings[0].count == 5
    assert crit.findings[0].detail == {"calls": 2, "unused": 3, "names": {"get": 5}}


def test_an_unlisted_tool_the_solved_episodes_do_without_is_not_named(env):
    """Half the episodes answer right and half wrong, none calls `get`: not calling it is no more
    common among the failed ones, so it is not what failed them."""
    h = env.default_harness(tools=[])
    exs = [env.episode("train", i, 1) for i in range(6)]
    trajs = [run_episode(ScriptedPolicy([f"<answer>{ex.answer if i % 2 else 0}</answer>"]), env, ex, h)
             for i, ex in enumerate(exs)]
    assert sum(t.reward == 1.0 for t in trajs) == 3
    assert Mode.UNKNOWN_TOOL not in {f.mode for f in critique(trajs, h, env.tool_specs()).findings}


def test_a_harness_that_lists_every_declared_tool_has_no_unlisted_tool(env):
    h = env.default_harness()
    crit = critique(run(env, h, lambda ex: ["<answer>12</answer>"]), h, env.tool_specs())
    assert Mode.UNKNOWN_TOOL not in {f.mode for f in crit.findings}
