"""Agent environments (trainer/envs/): disjoint train/held-out splits, the difficulty knob, the
verifiers on hand-made cases, tools whose every failure is an observation, and expert
demonstrations that the verifier accepts. The code environment runs in the real local sandbox;
a scripted FakeSandbox stands in for a sandbox that cannot run."""
from __future__ import annotations

import pytest

from sandboxes.fake import FakeSandbox
from trainer.envs import ENVS, make_env
from trainer.envs.calc import evaluate
from trainer.envs.base import ToolFailure
from trainer.tasks.base import Verdict


def test_registered_and_options_validated():
    assert {"lookup", "calc", "code"} <= set(ENVS)
    with pytest.raises(ValueError, match="unknown environment 'nope'"):
        make_env("nope")
    with pytest.raises(ValueError, match="unknown options"):
        make_env("lookup", colour=1)
    with pytest.raises(ValueError, match="ops_per_call=0"):
        make_env("calc", ops_per_call=0)
    with pytest.raises(ValueError, match="public_tests=0"):
        make_env("code", public_tests=0)
    with pytest.raises(ValueError, match="difficulty=7"):
        make_env("lookup").episode("train", 0, 7)


@pytest.mark.parametrize("name,difficulty", [("lookup", 1), ("lookup", 3), ("calc", 1), ("calc", 4)])
def test_splits_are_disjoint_and_reproducible(name, difficulty):
    env = make_env(name, seed=1)
    train = [env.episode("train", i, difficulty) for i in range(150)]
    held = [env.episode("heldout", i, difficulty) for i in range(150)]
    assert not {env.content_id(e) for e in train} & {env.content_id(e) for e in held}
    assert env.episode("train", 7, difficulty) == train[7]
    assert make_env(name, seed=2).episode("train", 7, difficulty) != train[7]
    assert train[0].uid == f"{name}/train/d{difficulty}/0" and held[3].uid == f"{name}/heldout/d{difficulty}/3"


def test_lookup_difficulty_and_hidden_table():
    env = make_env("lookup")
    for d in range(1, 7):
        for i in range(20):
            ex = env.episode("train", i, d)
            table, asked = ex.meta["table"], ex.meta["asked"]
            assert len(table) == 3 + 2 * d and len(asked) == d == len(set(asked))
            assert ex.answer == str(sum(table[k] for k in asked))
            assert not any(c.isdigit() for c in ex.question), "no value may be read off the question"
            assert all(f"'{k}'" in ex.question for k in asked)


def test_calc_difficulty_is_the_number_of_steps():
    env = make_env("calc")
    for d in (1, 4, 8):
        ex = env.episode("train", 0, d)
        assert len(ex.meta["steps"]) == d and ex.question.count(", then ") == d - 1


@pytest.mark.parametrize("expression,ops,value", [("2+3", 1, 5), ("12*34", 1, 408), ("-5-3", 1, -8), ("(7)", 1, 7),
                                                  ("2*3+4", 2, 10), ("2*(3+4)", 2, 14), ("10-20", 1, -10)])
def test_calc_evaluates(expression, ops, value):
    assert evaluate(expression, ops) == value


@pytest.mark.parametrize("expression,reason", [("2*3+4", "at most 1 operator"), ("2**8", "only integers"),
                                               ("__import__('os')", "only integers"), ("1.5+1", "only integers"),
                                               ("999999999*999999999", "too large"), ("2+", "cannot parse"),
                                               ("1" * 300, "longer than")])
def test_calc_refuses(expression, reason):
    with pytest.raises(ToolFailure, match=reason):
        evaluate(expression, 1)


@pytest.mark.parametrize("name", ["lookup", "calc"])
def test_verifiers_on_hand_made_answers(name):
    env = make_env(name)
    ex = env.episode("train", 3, 2)
    wrong = str(int(ex.answer) + 1)
    assert env.verify(ex, ex.answer).verdict is Verdict.CORRECT and env.verify(ex, ex.answer).reward == 1.0
    assert env.verify(ex, " 0" + ex.answer.lstrip("-") if not ex.answer.startswith("-") else ex.answer).reward == 1.0
    assert env.verify(ex, wrong).verdict is Verdict.WRONG and env.verify(ex, wrong).reward == 0.0
    assert env.verify(ex, "about forty").verdict is Verdict.MALFORMED
    assert env.verify(ex, None).verdict is Verdict.MALFORMED
    assert env.verify(ex, None, truncated=True).verdict is Verdict.TRUNCATED


def test_tool_failures_are_observations():
    env = make_env("lookup")
    ex = env.episode("train", 0, 1)
    key = ex.meta["asked"][0]
    assert env.call(ex, "get", {"key": key}).observation == str(ex.meta["table"][key])
    for name, args, kind, text in [("nope", {}, "unknown_tool", "unknown tool 'nope'; the tools are: get"),
                                   ("get", {}, "bad_arguments", "missing argument 'key'"),
                                   ("get", {"key": 3}, "bad_arguments", "is not a string"),
                                   ("get", {"key": "zzzz"}, "tool_error", "no key 'zzzz'")]:
        res = env.call(ex, name, args)
        assert res.error == kind and res.observation.startswith("error: ") and text in res.observation
    # a harness that does not list a tool hides it; a lenient one coerces arguments
    bare = env.default_harness(tools=[])
    assert env.call(ex, "get", {"key": key}, bare).error == "unknown_tool"
    lenient = env.default_harness(tool_syntax={"lenient": True})
    assert env.call(ex, "get", {"key": 3}, lenient).error == "tool_error"
    calc = make_env("calc")
    assert calc.call(calc.episode("train", 0, 1), "calc", {"expression": "2*3*4"}).error == "tool_error"


def test_a_crashing_tool_is_an_observation(monkeypatch):
    env = make_env("lookup")
    ex = env.episode("train", 0, 1)
    monkeypatch.setattr(type(env), "_get", staticmethod(lambda ex, args: 1 / 0))
    res = env.call(ex, "get", {"key": "x"})
    assert res.error == "tool_error" and "ZeroDivisionError" in res.observation


@pytest.mark.parametrize("name", ["lookup", "calc"])
def test_demonstrations_solve_the_pure_envs(name):
    env = make_env(name)
    for d in (1, 3):
        for i in range(5):
            ex = env.episode("heldout", i, d)
            calls, answer = env.demo(ex)
            assert len(calls) == d
            assert all(env.call(ex, n, a).error is None for n, a in calls)
            assert env.verify(ex, answer).verdict is Verdict.CORRECT


@pytest.fixture(scope="module")
def code_env():
    env = make_env("code", seed=2, timeout=3.0)
    yield env
    env.close()


def test_code_run_tests_in_the_sandbox(code_env):
    ex = code_env.episode("train", 0, 3)
    fn = ex.meta["function"]
    assert ex.meta["public_inputs"] != ex.meta["inputs"] and len(ex.meta["public_inputs"]) == 3
    calls, answer = code_env.demo(ex)
    assert code_env.call(ex, *calls[0]).observation == "3/3 tests passed"
    assert code_env.verify(ex, answer).verdict is Verdict.CORRECT
    res = code_env.call(ex, "run_tests", {"code": f"def {fn}(xs):\n    return 'nope'\n"})
    assert res.error is None and res.observation.startswith("0/3 tests passed")
    first = ex.meta["public_inputs"][0]
    assert f"{fn}({first}) returned \"nope\", expected" in res.observation
    for code, text in [("def (", "syntax error"), ("x = 1\n", f"no function named {fn}"),
                       ("raise ValueError('x')\n", "failed on import")]:
        got = code_env.call(ex, "run_tests", {"code": code})
        assert got.error == "tool_error" and text in got.observation, got
    assert code_env.verify(ex, f"def {fn}(xs):\n    return 'nope'\n").verdict is Verdict.WRONG


def test_code_sandbox_failure_is_an_observation():
    env = make_env("code", sandbox=FakeSandbox([RuntimeError("engine went away")]))
    ex = env.episode("train", 0, 2)
    res = env.call(ex, "run_tests", {"code": ex.solution})
    assert res.error == "sandbox_error" and "could not run" in res.observation
