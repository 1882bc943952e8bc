"""The `code` task family: generation, verdicts, hostile solutions, batching, and use in scoring.

Solutions run for real in the local sandbox (bubblewrap here, the plain fallback elsewhere); one
test runs the same on Docker (marker `docker`). A scripted `FakeSandbox` checks what is sent in.
"""
from __future__ import annotations

import json
import pickle

import pytest

from harness.spec import AnswerFormat, HarnessSpec
from sandboxes.fake import FakeSandbox, ok_result
from trainer.tasks.base import Split, TASKS, Verdict, make_task
from trainer.tasks.code import CodeTask, pipeline_for, run_pipeline, solution_source, strip_fence

FENCED = AnswerFormat(regex=r"```python\n(.*?)```", stop=None)


@pytest.fixture(scope="module")
def task():
    t = CodeTask(seed=3, timeout=2.0)
    yield t
    t.close()


def fenced(code: str) -> str:
    return f"Here you go:\n```python\n{code}```\n"


def test_registered_and_built_by_name():
    assert TASKS["code"] is CodeTask
    t = make_task("code", seed=1, sandbox="local", n_tests=5)
    assert isinstance(t, CodeTask) and len(t.example(Split.TRAIN, 0, 3).meta["inputs"]) == 5


def test_options_are_validated():
    for bad, match in [({"sandbox": "vm"}, "sandbox='vm'"), ({"n_tests": 0}, "n_tests=0"),
                       ({"timeout": -1}, "timeout=-1"), ({"reward": "max"}, "reward='max'"),
                       ({"workers": 0}, "workers=0"), ({"colour": "red"}, "unknown options")]:
        with pytest.raises(ValueError, match=match):
            CodeTask(**bad)


@pytest.mark.parametrize("difficulty", range(1, 11))
def test_generation_grows_with_difficulty(difficulty):
    t = CodeTask(seed=0)
    for i in range(20):
        e = t.example(Split.TRAIN, i, difficulty)
        m = e.meta
        assert len(m["stages"]) + (m["reduce"] is not None) == difficulty
        assert e.question.startswith(f"Write a Python function named {m['function']}")
        assert len(m["inputs"]) == 8 and [] in m["inputs"]
        assert len({json.dumps(x) for x in m["expected"]}) > 1, "a constant would pass every test"
        # the reference solution, run on the host, reproduces the expected outputs
        ns: dict = {}
        exec(compile(e.solution, "<solution>", "exec"), ns)
        assert [ns[m["function"]](list(x)) for x in m["inputs"]] == m["expected"]
    if difficulty < 3:
        assert not any(op in ("sort", "reverse", "prefix_sum") for op, _ in m["stages"])


def test_examples_are_deterministic_and_splits_differ():
    a, b, other = CodeTask(seed=1), CodeTask(seed=1), CodeTask(seed=2)
    assert a.example("train", 5, 6) == b.example("train", 5, 6)
    assert a.example("train", 5, 6).question != other.example("train", 5, 6).question
    train = {a.example("train", i, 4).question for i in range(60)}
    held = {a.example("heldout", i, 4).question for i in range(20)}
    assert not train & held


def test_reference_solutions_pass_at_every_difficulty(task):
    examples = [task.example(Split.TRAIN, i, d) for d in range(1, 11) for i in range(2)]
    results = task.verify_many([fenced(e.solution) for e in examples], examples, FENCED.extract)
    assert all(r.verdict is Verdict.CORRECT and r.reward == 1.0 for r in results), results


def test_verdicts_are_verdicts_not_crashes(task):
    e = task.example(Split.TRAIN, 0, 5)
    fn = e.meta["function"]
    cases = {
        "def broken(:\n": (Verdict.MALFORMED, "syntax error"),
        "def other_name(xs):\n    return xs\n": (Verdict.MALFORMED, f"no function named {fn}"),
        f"{fn} = 3\n": (Verdict.MALFORMED, f"no function named {fn}"),
        "raise RuntimeError('nope')\n": (Verdict.WRONG, "failed on import: RuntimeError"),
        "import os\nos._exit(4)\n": (Verdict.WRONG, "no test ran"),
        f"def {fn}(xs):\n    while True:\n        pass\n": (Verdict.WRONG, "timeout after 0 of 8"),
        f"def {fn}(xs):\n    return 1 / 0\n": (Verdict.WRONG, "0/8"),
        f"def {fn}(xs):\n    return {{1, 2}}\n": (Verdict.WRONG, "0/8"),
        f"import sys\ndef {fn}(xs):\n    while True:\n        print('x' * 10000)\n": (Verdict.WRONG, "output limit"),
        f"def {fn}(xs):\n    return bytearray(1 << 40)\n": (Verdict.WRONG, "0/8"),
        "\0": (Verdict.MALFORMED, ""),
    }
    for code, (verdict, detail) in cases.items():
        r = task.check(code, e)
        assert r.verdict is verdict and detail in r.detail, (code, r)
        assert r.reward == 0.0


def test_partial_credit_is_the_share_of_tests(task):
    e = task.example(Split.TRAIN, 1, 4)
    fn = e.meta["function"]
    # Right on the empty input only (every pipeline maps [] to [] or to its reduction of []).
    code = solution_source(fn, [], None).replace("return xs", f"return {json.dumps(e.meta['expected'][0])}")
    r = task.check(code, e)
    n_ok = sum(json.dumps(x) == json.dumps(e.meta["expected"][0]) for x in e.meta["expected"])
    assert r.verdict is Verdict.WRONG and r.reward == pytest.approx(n_ok / 8) and f"{n_ok}/8" in r.detail
    assert task.partial_credit(code, e) == pytest.approx(n_ok / 8)
    strict = CodeTask(seed=3, reward="all", sandbox=task.sandbox)
    assert strict.check(code, e).reward == 0.0 and strict.partial_credit(code, e) == pytest.approx(n_ok / 8)
    # Tests that finished before a timeout still count.
    slow = (f"import time\n{e.solution}\n_orig = {fn}\n"
            f"def {fn}(xs):\n    if len(xs) > 4:\n        time.sleep(60)\n    return _orig(xs)\n")
    r = task.check(slow, e)
    first_long = next(i for i, x in enumerate(e.meta["inputs"]) if len(x) > 4)
    assert "timeout" in r.detail and r.reward == pytest.approx(first_long / 8), r


def test_hostile_solutions_are_contained(task):
    e = task.example(Split.TRAIN, 2, 3)
    fn = e.meta["function"]
    bomb = (f"import os\ndef {fn}(xs):\n    while True:\n"
            "        try:\n            os.fork()\n        except OSError:\n            pass\n")
    r = task.check(bomb, e)
    assert r.verdict is Verdict.WRONG and r.reward == 0.0
    peek = f"import json\ndef {fn}(xs):\n    return json.load(open('cases.json'))\n"
    assert task.check(peek, e).reward == 0.0
    assert task.check(e.solution, e).verdict is Verdict.CORRECT  # the sandbox still works


def test_expected_outputs_never_enter_the_sandbox():
    sb = FakeSandbox([ok_result("")])
    t = CodeTask(seed=0, sandbox=sb)
    e = t.example(Split.TRAIN, 0, 6)
    r = t.check(e.solution, e)
    assert r.verdict is Verdict.WRONG and "no test ran" in r.detail  # the fake printed nothing
    (req,) = sb.calls
    sent = b"".join(req.files.values()) + " ".join(req.argv).encode()
    assert json.loads(req.files["cases.json"]) == [[x] for x in e.meta["inputs"]]
    assert json.dumps(e.meta["expected"]).encode() not in sent
    assert "solution.py" in req.files and req.files["solution.py"] == e.solution.strip().encode()


def test_sandbox_errors_score_zero_and_are_logged(caplog):
    t = CodeTask(seed=0, sandbox=FakeSandbox([RuntimeError("engine went away")]))
    e = t.example(Split.TRAIN, 0, 2)
    with caplog.at_level("ERROR"):
        r = t.check(e.solution, e)
    assert r.reward == 0.0 and "sandbox error" in r.detail and "engine went away" in r.detail
    assert any("could not run a solution" in rec.message for rec in caplog.records)


def test_results_are_cached_so_partial_credit_does_not_rerun():
    e = CodeTask(seed=0).example(Split.TRAIN, 0, 2)
    tag_echo = []

    def runner(req):
        tag = req.argv[-2]
        tag_echo.append(tag)
        lines = [f"{tag} " + json.dumps({"i": i, "out": x}) for i, x in enumerate(e.meta["expected"][:4])]
        return ok_result("\n".join(lines) + "\n")

    sb = FakeSandbox([runner])
    t = CodeTask(seed=0, sandbox=sb)
    assert t.check(e.solution, e).reward == pytest.approx(0.5)
    assert t.partial_credit(e.solution, e) == pytest.approx(0.5)
    assert len(sb.calls) == 1


def test_verify_many_handles_missing_answers_and_truncation(task):
    exs = [task.example(Split.TRAIN, i, 2) for i in range(4)]
    comps = [fenced(exs[0].solution), "no code here", "```python\ndef f(", fenced("def broken(:\n")]
    res = task.verify_many(comps, exs, FENCED.extract, truncated=[False, False, True, False])
    assert [r.verdict for r in res] == [Verdict.CORRECT, Verdict.MALFORMED, Verdict.TRUNCATED, Verdict.MALFORMED]
    with pytest.raises(ValueError, match="verify_many"):
        task.verify_many(comps, exs[:2], FENCED.extract)


def test_usable_through_the_harness_like_any_task(task):
    harness = HarnessSpec(template="{question}\n", answer=FENCED)
    e = task.example(Split.TRAIN, 7, 3)
    assert "{question}" not in harness.render(e.question)
    good = task.verify(fenced(e.solution), e, harness.answer.extract)
    assert good.verdict is Verdict.CORRECT and good.reward == 1.0
    assert task.verify("I don't know", e, harness.answer.extract).verdict is Verdict.MALFORMED
    assert strip_fence("```python\nx = 1\n```") == "x = 1\n"


def test_rollout_scoring_gives_the_share_of_tests_as_grpo_reward(task):
    from harness.reward import score

    harness = HarnessSpec(template="{question}\n", answer=FENCED, reward={"kind": "partial"})
    e = task.example(Split.TRAIN, 1, 4)
    fn = e.meta["function"]
    code = f"def {fn}(xs):\n    return {json.dumps(e.meta['expected'][0])}\n"
    share = sum(json.dumps(x) == json.dumps(e.meta["expected"][0]) for x in e.meta["expected"]) / 8
    res, reward = score(task, harness, e, fenced(code), False, True)
    assert res.verdict is Verdict.WRONG and reward == pytest.approx(share)
    res, reward = score(task, harness, e, fenced(e.solution), False, True)
    assert res.verdict is Verdict.CORRECT and reward == 1.0


def test_a_grpo_run_on_the_code_task(tmp_path):
    from trainer.config import RunConfig
    from trainer.loop import Trainer

    cfg = RunConfig.parse({
        "name": "code", "out_dir": str(tmp_path), "threads": 1, "samples_per_step": 2,
        "task": {"name": "code", "options": {"sandbox": "local", "timeout": 2}},
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 512},
        "harness": {"template": "{question}\n", "answer": {"regex": "```python\n(.*?)```", "stop": None},
                    "sampling": {"max_new_tokens": 16}, "curriculum": {"start": 1}, "reward": {"kind": "partial"},
                    "filters": {"max_prompt_chars": 4096}},
        "recipe": {"algorithm": "grpo", "steps": 2, "batch_size": 2, "group_size": 4, "warmup_steps": 0,
                   "eval_interval": 0, "eval_size": 4},
        "checkpoint": {"interval": 0},
    })
    summary = Trainer(cfg).run()
    assert summary["status"] == "completed" and summary["step"] == 2


def test_pickles_for_remote_workers(task):
    e = task.example(Split.TRAIN, 0, 2)
    task.check(e.solution, e)  # the sandbox and pool now exist
    clone = pickle.loads(pickle.dumps(task))
    assert clone._sandbox is None and clone.check(e.solution, e).verdict is Verdict.CORRECT
    clone.close()


def test_pipeline_helpers_agree():
    import random

    rng = random.Random(0)
    for d in range(1, 11):
        stages, reduce = pipeline_for(rng, d)
        ns: dict = {}
        exec(solution_source("f", stages, reduce), ns)
        for xs in ([], [3, -1, 4, 1, -5, 9], [2, 2, 2]):
            assert ns["f"](list(xs)) == run_pipeline(stages, reduce, xs)


@pytest.mark.docker
def test_runs_in_docker_too():
    from sandboxes.docker_backend import docker_status

    ok, why = docker_status()
    if not ok:
        pytest.skip(f"docker: {why}")
    t = CodeTask(seed=0, sandbox="docker", timeout=2.0)
    try:
        exs = [t.example(Split.TRAIN, i, 4) for i in range(3)]
        fn = exs[2].meta["function"]
        comps = [fenced(exs[0].solution), fenced("def nope(:\n"), fenced(f"def {fn}(xs):\n    while True: pass\n")]
        res = t.verify_many(comps, exs, FENCED.extract)
        assert [r.verdict for r in res] == [Verdict.CORRECT, Verdict.MALFORMED, Verdict.WRONG]
        assert "timeout" in res[2].detail
        assert t.sandbox.isolation.value == "docker"
    finally:
        t.close()
