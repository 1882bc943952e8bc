"""Countdown: combine the given numbers with + - * / to hit the target.

Question "3 7 25 50->75" (numbers, then "->" and the target); answer an arithmetic expression
such as "(3+7)*5" that uses each given number at most once (not all need be used) and whose exact
value is the target. Difficulty is how many numbers are given (2..6).

The target is reachable by construction: a random binary expression tree over all the numbers,
where each node picks an operation that keeps every intermediate value a positive integer no larger
than `max_target` (subtraction and division put the larger operand first; division only when
exact). That expression, with the fewest parentheses, is the `solution` (the SFT target) and the
`answer` (one of possibly many correct ones; the verifier accepts any).

The verifier never evaluates text as Python: it parses with `ast` and accepts only binary
+ - * / over integer literals (no unary minus, no **, no //, no names or calls), checks the
literals against the given numbers as a multiset, then evaluates with `fractions.Fraction`.
Partial credit for a valid expression is 1 - min(1, |value - target| / target).
"""
from __future__ import annotations

import ast
import collections
import dataclasses
import random
from fractions import Fraction
from typing import Any, ClassVar

from sandboxes.errors import SwarmlabError
from trainer.tasks.base import Example, Task, Verdict, VerifyResult, register_task

MAX_ANSWER_CHARS = 200  # a longer answer is MALFORMED before any parsing
_ALLOWED_CHARS = frozenset("0123456789+-*/() ")
_OPS: dict[type[ast.operator], str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


class MalformedExpression(SwarmlabError, ValueError):
    """The answer is not an expression of the allowed form."""


@dataclasses.dataclass(frozen=True)
class _Node:
    """An expression tree: a leaf holds `value` only; an inner node has `op`, `left`, `right`."""

    value: int
    op: str | None = None
    left: "_Node | None" = None
    right: "_Node | None" = None

    def render(self) -> str:
        if self.op is None:
            return str(self.value)
        assert self.left is not None and self.right is not None, "inner node without children"
        left, right = self.left.render(), self.right.render()
        if self.left.op is not None and _PREC[self.left.op] < _PREC[self.op]:
            left = f"({left})"
        # a right operand of equal precedence needs parentheses only under - and /
        if self.right.op is not None and (
            _PREC[self.right.op] < _PREC[self.op] or (_PREC[self.right.op] == _PREC[self.op] and self.op in "-/")
        ):
            right = f"({right})"
        return f"{left}{self.op}{right}"


def _combine(rng: random.Random, a: _Node, b: _Node, max_target: int) -> _Node:
    hi, lo = (a, b) if a.value >= b.value else (b, a)
    choices: list[_Node] = []
    if a.value + b.value <= max_target:
        choices.append(_Node(a.value + b.value, "+", a, b))
    if a.value * b.value <= max_target:
        choices.append(_Node(a.value * b.value, "*", a, b))
    if hi.value != lo.value:
        choices.append(_Node(hi.value - lo.value, "-", hi, lo))
    if hi.value % lo.value == 0:
        choices.append(_Node(hi.value // lo.value, "/", hi, lo))
    # never empty: equal operands always divide, unequal ones always subtract
    assert choices, f"no operation for {a.value}, {b.value}"
    # "*1" and "/1" add a number without adding a step: only when nothing else is possible
    useful = [c for c in choices if not (c.op in "*/" and c.right is not None and c.right.value == 1)]
    useful = [c for c in useful if not (c.op == "*" and c.left is not None and c.left.value == 1)]
    return rng.choice(useful or choices)


def _build(rng: random.Random, leaves: list[_Node], max_target: int) -> _Node:
    if len(leaves) == 1:
        return leaves[0]
    k = rng.randint(1, len(leaves) - 1)
    return _combine(rng, _build(rng, leaves[:k], max_target), _build(rng, leaves[k:], max_target), max_target)


def parse_expression(text: str) -> tuple[ast.expr, list[int]]:
    """Parse `text` into an AST of binary + - * / over int literals; return it and its literals.

    Raises `MalformedExpression` for anything else. Nothing is ever evaluated here."""
    if len(text) > MAX_ANSWER_CHARS:
        raise MalformedExpression(f"answer longer than {MAX_ANSWER_CHARS} characters")
    bad = sorted(set(text) - _ALLOWED_CHARS)
    if bad:
        raise MalformedExpression(f"characters not allowed in an expression: {''.join(bad)!r}")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise MalformedExpression(f"not an expression: {type(e).__name__}") from None
    literals: list[int] = []

    def walk(node: ast.expr) -> None:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            walk(node.left)
            walk(node.right)
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            literals.append(node.value)
        else:
            what = type(node.op).__name__ if isinstance(node, ast.BinOp) else type(node).__name__
            raise MalformedExpression(f"{what} is not allowed (only + - * / on integers)")

    walk(tree.body)
    return tree.body, literals


def evaluate(node: ast.expr) -> Fraction:
    """Exact value of an AST accepted by `parse_expression` (raises ZeroDivisionError)."""
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    assert isinstance(node, ast.BinOp), f"unexpected node {type(node).__name__}"
    left, right = evaluate(node.left), evaluate(node.right)
    op = _OPS[type(node.op)]
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    return left / right


def _fmt(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


@register_task
class Countdown(Task):
    name = "countdown"
    min_difficulty = 2
    max_difficulty = 6
    # question: digits, space, "->"; answers: digits, + - * /, parentheses (spaces tolerated)
    charset: ClassVar[str] = "0123456789 ->+*/()"
    names = ("countdown", "count down", "countdown game", "numbers game")
    words = ("target", "expression", "expressions", "reach", "combine", "numbers", "arithmetic")
    difficulty_patterns = (r"\b(\d+) (?:given |input |starting |source )?numbers\b",) + Task.difficulty_patterns
    difficulty_label = "{d} numbers"
    unread_options = ("max_number", "max_target")

    def __init__(self, seed: int = 0, max_number: int = 25, max_target: int = 999, **options: Any) -> None:
        super().__init__(seed=seed, **options)
        if max_number < 2:
            raise ValueError(f"task 'countdown': max_number={max_number} must be >= 2")
        if max_target < max_number:
            raise ValueError(f"task 'countdown': max_target={max_target} must be >= max_number={max_number}")
        self.max_number = max_number
        self.max_target = max_target

    def max_lengths(self, difficulty: int) -> tuple[int, int]:
        """n numbers of at most len(max_number) digits with spaces, "->", a target <= max_target; the
        answer: the n numbers, n-1 operators and a pair of parentheses around each inner node but the
        root (n-2 of them)."""
        n, w = difficulty, len(str(self.max_number))
        return n * (w + 1) - 1 + 2 + len(str(self.max_target)), n * w + (n - 1) + 2 * max(n - 2, 0)

    def make(self, rng: random.Random, difficulty: int) -> Example:
        numbers = [rng.randint(1, self.max_number) for _ in range(difficulty)]
        # a target equal to a given number is solved by writing that number: redraw a few times
        for _ in range(8):
            order = numbers[:]
            rng.shuffle(order)
            tree = _build(rng, [_Node(n) for n in order], self.max_target)
            if tree.value not in numbers:
                break
        solution = tree.render()
        question = " ".join(map(str, numbers)) + f"->{tree.value}"
        return Example(
            uid="", question=question, answer=solution, solution=solution,
            meta={"numbers": numbers, "target": tree.value},
        )

    def _value(self, parsed: str, example: Example) -> tuple[Fraction | None, VerifyResult | None]:
        """The value of a valid answer, or the failing result."""
        try:
            tree, literals = parse_expression(parsed)
        except MalformedExpression as e:
            return None, VerifyResult(0.0, Verdict.MALFORMED, parsed, str(e))
        given = collections.Counter(example.meta["numbers"])
        for n, used in sorted(collections.Counter(literals).items()):
            if used > given[n]:
                detail = (
                    f"uses {n}, which is not given" if given[n] == 0
                    else f"uses {n} {used} times, given {given[n]}"
                )
                return None, VerifyResult(0.0, Verdict.WRONG, parsed, detail)
        try:
            return evaluate(tree), None
        except ZeroDivisionError:
            return None, VerifyResult(0.0, Verdict.WRONG, parsed, "division by zero")

    def reference(self, example: Example) -> Example | None:
        nums, sep, target = example.question.partition("->")
        parts = nums.split()
        if not (sep and parts and all(x.isascii() and x.isdigit() for x in [*parts, target])):
            return None
        return dataclasses.replace(example, meta={**example.meta, "numbers": [int(x) for x in parts], "target": int(target)})

    def check(self, parsed: str, example: Example) -> VerifyResult:
        value, failed = self._value(parsed, example)
        if failed is not None:
            return failed
        assert value is not None, "no value and no failure"
        target = example.meta["target"]
        if value == target:
            return VerifyResult(1.0, Verdict.CORRECT, parsed)
        return VerifyResult(0.0, Verdict.WRONG, parsed, f"value {_fmt(value)} != target {target}")

    def partial_credit(self, parsed: str, example: Example) -> float:
        value, failed = self._value(parsed, example)
        if failed is not None or value is None:
            return 0.0
        target = example.meta["target"]
        return float(1 - min(Fraction(1), abs(value - target) / target))
