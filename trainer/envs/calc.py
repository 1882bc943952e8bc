"""`calc`: multi-step integer arithmetic with a `calc(expression)` tool.

An episode starts from a two-digit number and applies d steps ("multiply by 23", "add 158",
"subtract 76"), operands of two or three digits, so the answer is hard to compute in the head of
a small model and easy with the tool. The tool evaluates an integer expression with at most
`ops_per_call` operators (+, -, *; parentheses and a unary minus allowed), so a d-step problem
takes d calls at the default of 1. It is evaluated from the syntax tree, never with `eval`; an
expression it refuses is a tool error the policy reads. The verifier compares integers.
"""
from __future__ import annotations

import ast
import operator
import random
from typing import Any

from harness.tools import ToolSpec, params
from trainer.envs.base import AgentEnv, Tool, ToolFailure, check_integer, register_env
from trainer.tasks.base import Example, VerifyResult

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
SYMBOL = {"add": "+", "subtract": "-", "multiply by": "*"}
MAX_ABS = 10**15
MAX_EXPRESSION_CHARS = 200


def evaluate(expression: str, max_ops: int) -> int:
    """The value of an integer expression of at most `max_ops` binary operators; ToolFailure says
    why one is refused."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolFailure(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ToolFailure(f"cannot parse {expression!r}") from None
    count = 0

    def ev(node: ast.expr) -> int:
        nonlocal count
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            count += 1
            if count > max_ops:
                raise ToolFailure(f"at most {max_ops} operator{'s' if max_ops > 1 else ''} per call")
            v = OPS[type(node.op)](ev(node.left), ev(node.right))
            if abs(v) > MAX_ABS:
                raise ToolFailure("the result is too large")
            return v
        raise ToolFailure("only integers, +, -, * and parentheses are allowed")

    try:
        return ev(tree)
    except RecursionError:
        raise ToolFailure("the expression is nested too deeply") from None


@register_env
class CalcEnv(AgentEnv):
    name = "calc"
    min_difficulty = 1
    max_difficulty = 8

    def __init__(self, seed: int = 0, ops_per_call: int = 1, **options: Any) -> None:
        super().__init__(seed=seed, **options)
        if not (isinstance(ops_per_call, int) and 1 <= ops_per_call <= 16):
            raise ValueError(f"environment 'calc': ops_per_call={ops_per_call!r} must be an integer in [1, 16]")
        self.ops_per_call = ops_per_call

    def tools(self) -> list[Tool]:
        n = self.ops_per_call
        spec = ToolSpec(name="calc", description=f"the value of an integer expression with at most {n} operator"
                        f"{'s' if n > 1 else ''} (+, -, *), e.g. 12*34", parameters=params(expression="string"))
        return [Tool(spec, lambda ex, args: str(evaluate(args["expression"], self.ops_per_call)))]

    def make(self, rng: random.Random, difficulty: int) -> Example:
        value = rng.randint(10, 99)
        steps = []
        for _ in range(difficulty):
            op = rng.choice(sorted(SYMBOL))
            k = rng.randint(2, 29) if op == "multiply by" else rng.randint(10, 999)
            steps.append((op, k))
        words = ", then ".join(f"{op} {k}" for op, k in steps)
        question = f"Start with {value}. {words[0].upper()}{words[1:]}. What is the result?"
        trace = [value]
        for op, k in steps:
            trace.append(OPS[{"+": ast.Add, "-": ast.Sub, "*": ast.Mult}[SYMBOL[op]]](trace[-1], k))
        meta = {"start": value, "steps": [[SYMBOL[op], k] for op, k in steps]}
        return Example(uid="", question=question, answer=str(trace[-1]), meta=meta)

    def check(self, parsed: str, example: Example) -> VerifyResult:
        return check_integer(parsed, example)

    def demo(self, example: Example) -> tuple[list[tuple[str, dict[str, Any]]], str]:
        calls, value = [], example.meta["start"]
        for sym, k in example.meta["steps"]:
            calls.append(("calc", {"expression": f"{value}{sym}{k}"}))
            value = evaluate(f"{value}{sym}{k}", 1)
        return calls, str(value)
