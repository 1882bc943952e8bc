"""`code`: the code task (`trainer/tasks/code.py`) as an agent environment, with a `run_tests` tool.

An episode is the code task's example at difficulty d (d pipeline stages). The `run_tests(code)`
tool runs the policy's code in the task's sandbox against a few public test inputs drawn for the
episode (not the hidden ones the verifier uses, so what the tool shows cannot be copied into the
answer) and reports which passed, with the input, the expected and the returned value of the first
failures. A syntax error, a missing function, a crash, a timeout and a sandbox that cannot run at
all are observations. The final answer is the code; the verifier is the task's (the hidden tests
in the sandbox; reward the share passed, 1 only when all pass).

Options: those of the code task (`sandbox`, `n_tests`, `timeout`, `reward`, `workers`) plus
`public_tests` (1..16, default 3). Answers are multi-line: `default_harness` gives 256 tokens a turn.
"""
from __future__ import annotations

import ast
import json
import random
import secrets
from typing import Any

from harness.spec import Sampling
from harness.tools import ToolSpec, params
from trainer.envs.base import AgentEnv, SandboxFailure, Tool, ToolFailure, register_env
from trainer.tasks.base import Example, VerifyResult
from trainer.tasks.code import CodeTask, Stage, _canon, run_pipeline, strip_fence

SHOWN_FAILURES = 3


@register_env
class CodeEnv(AgentEnv):
    name = "code"
    min_difficulty = CodeTask.min_difficulty
    max_difficulty = CodeTask.max_difficulty

    def __init__(self, seed: int = 0, public_tests: int = 3, **options: Any) -> None:
        task_keys = ("sandbox", "n_tests", "timeout", "reward", "workers")
        task_options = {k: options.pop(k) for k in task_keys if k in options}
        super().__init__(seed=seed, **options)
        if not (isinstance(public_tests, int) and 1 <= public_tests <= 16):
            raise ValueError(f"environment 'code': public_tests={public_tests!r} must be an integer in [1, 16]")
        self.public_tests = public_tests
        self.task = CodeTask(seed=seed, **task_options)

    def tools(self) -> list[Tool]:
        spec = ToolSpec(name="run_tests", description="runs your Python code on a few test inputs and reports "
                        "which pass", parameters=params(code="string"))
        return [Tool(spec, self._run_tests)]

    def default_harness(self, **fields: Any) -> Any:
        return super().default_harness(**{"sampling": Sampling(max_new_tokens=256), **fields})

    # ---- episodes ------------------------------------------------------------------
    def make(self, rng: random.Random, difficulty: int) -> Example:
        raise NotImplementedError("the code environment draws its episodes from the code task")

    def episode(self, split: Any, index: int, difficulty: int) -> Example:
        self.check_difficulty(difficulty)
        ex = self.task.example(split, index, difficulty)   # the task's split: disjoint by question
        rng = random.Random(f"public|{ex.uid}|{self.seed}")
        stages = [Stage(op, k) for op, k in ex.meta["stages"]]
        inputs = [[rng.randint(-20, 20) for _ in range(rng.randint(1, 6))] for _ in range(self.public_tests)]
        expected = [run_pipeline(stages, ex.meta["reduce"], xs) for xs in inputs]
        meta = {**ex.meta, "public_inputs": inputs, "public_expected": expected}
        return Example(ex.uid, ex.question, ex.answer, ex.solution, ex.difficulty, meta)

    # ---- the tool ----------------------------------------------------------------
    def _run_tests(self, example: Example, args: dict[str, Any]) -> str:
        from sandboxes import StopReason

        code = strip_fence(args["code"])
        try:
            ast.parse(code)
        except SyntaxError as e:
            raise ToolFailure(f"syntax error: {e.msg} (line {e.lineno})") from None
        except (ValueError, MemoryError, RecursionError) as e:
            raise ToolFailure(f"the code does not parse: {type(e).__name__}") from None
        fn = example.meta["function"]
        public = Example(example.uid, example.question, "", None, example.difficulty,
                         {"function": fn, "inputs": example.meta["public_inputs"]})
        tag = secrets.token_hex(8)
        res = self.task.sandbox.execute(self.task.sandbox_request(code, public, tag))
        if res.reason is StopReason.ERROR:
            raise SandboxFailure(f"the sandbox could not run the code: {res.detail[:200]}")
        got: dict[int, dict[str, Any]] = {}
        status: dict[str, Any] = {}
        for line in res.stdout_text.splitlines():
            if not line.startswith(tag + " "):
                continue
            try:
                obj = json.loads(line[len(tag) + 1:])
            except ValueError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("i"), int):
                got.setdefault(obj["i"], obj)
            elif isinstance(obj, dict) and "status" in obj:
                status = status or obj
        if status.get("status") == "missing":
            raise ToolFailure(f"no function named {fn}")
        if status.get("status") == "import_error":
            raise ToolFailure(f"the code failed on import: {status.get('error')}")
        lines, passed = [], 0
        expected = example.meta["public_expected"]
        for i, (xs, want) in enumerate(zip(example.meta["public_inputs"], expected)):
            r = got.get(i)
            if r is not None and "out" in r and _canon(r["out"]) == _canon(want):
                passed += 1
                continue
            if len(lines) < SHOWN_FAILURES:
                what = ("did not finish" if r is None else f"raised {r['error']}" if "error" in r
                        else f"returned {json.dumps(r['out'])}")
                lines.append(f"{fn}({xs}) {what}, expected {json.dumps(want)}")
        head = f"{passed}/{len(expected)} tests passed"
        if res.reason is not StopReason.EXIT:
            head += f" (stopped: {res.reason.value})"
        return "\n".join([head] + lines)

    # ---- scoring -------------------------------------------------------------------
    def check(self, parsed: str, example: Example) -> VerifyResult:
        return self.task.check(parsed, example)

    def demo(self, example: Example) -> tuple[list[tuple[str, dict[str, Any]]], str]:
        return [("run_tests", {"code": example.solution})], example.solution or ""

    def close(self) -> None:
        self.task.close()
