"""Integer addition and multiplication: `addition` ("123+456" -> "579") and `multiplication`
("123*456" -> "56088").

Difficulty is the number of digits of each operand (1..12); a one-digit operand may be 0, longer
ones have no leading zero. The verifier compares integers written as plain decimal (an optional
sign, digits, leading zeros tolerated); anything else is MALFORMED. Partial credit is the share of
digits that match the truth aligned from the right (the units digit is learnt first), over the
longer of the two.
"""
from __future__ import annotations

import dataclasses

import random
import re
from typing import ClassVar

from trainer.tasks.base import Example, Task, Verdict, VerifyResult, register_task

_INT = re.compile(r"([+-]?)(\d+)")


def canonical_int(text: str) -> str | None:
    """`text` as a canonical decimal integer string ("-012" -> "-12"), or None if it is not one.

    Compares as strings, so an absurdly long answer costs no big-int conversion."""
    m = _INT.fullmatch(text.strip())
    if m is None:
        return None
    digits = m.group(2).lstrip("0") or "0"
    return ("-" if m.group(1) == "-" and digits != "0" else "") + digits


def right_aligned_match(parsed: str, truth: str) -> float:
    """Share of positions, aligned from the right, where the strings agree (over the longer one)."""
    n = max(len(parsed), len(truth))
    if n == 0:
        return 1.0
    same = sum(a == b for a, b in zip(reversed(parsed), reversed(truth)))
    return same / n


class _BinaryArithmetic(Task):
    op: ClassVar[str]
    min_difficulty = 1
    max_difficulty = 12
    charset: ClassVar[str] = "0123456789+*-"  # '-' only ever in a (wrong) negative answer
    answer_is_shortest: ClassVar[bool] = True   # one integer, read canonically: leading zeros only lengthen it
    words = ("number", "numbers", "integer", "integers", "digit", "digits", "arithmetic")
    difficulty_patterns = (r"(\d+)[- ]digits?\b", r"\bof (\d+) digits\b") + Task.difficulty_patterns
    difficulty_label = "{d} digits"
    # a sum's or product's digits are worked out lowest first (the carry moves up): written in that
    # order, each digit a left-to-right decoder writes follows from the question and the digits
    # before it (Lee et al. 2023, "Teaching Arithmetic to Small Transformers": reversed output)
    answer_format = {"reverse_digits": True}
    answer_format_why = ("the answer's digits are worked out lowest first (the carry): written in that order, each "
                         "follows from the question and the digits before it")

    def _apply(self, a: int, b: int) -> int:
        raise NotImplementedError

    def make(self, rng: random.Random, difficulty: int) -> Example:
        lo = 0 if difficulty == 1 else 10 ** (difficulty - 1)
        hi = 10**difficulty - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        answer = str(self._apply(a, b))
        return Example(uid="", question=f"{a}{self.op}{b}", answer=answer, meta={"a": a, "b": b})

    def reference(self, example: Example) -> Example | None:
        a, sep, b = example.question.partition(self.op)
        if not (sep and a.isascii() and a.isdigit() and b.isascii() and b.isdigit()):
            return None
        return dataclasses.replace(example, answer=str(self._apply(int(a), int(b))), solution=None)

    def check(self, parsed: str, example: Example) -> VerifyResult:
        got = canonical_int(parsed)
        if got is None:
            return VerifyResult(0.0, Verdict.MALFORMED, parsed, "answer is not an integer")
        if got == example.answer:
            return VerifyResult(1.0, Verdict.CORRECT, parsed)
        return VerifyResult(0.0, Verdict.WRONG, parsed, f"{got} != {example.answer}")

    def partial_credit(self, parsed: str, example: Example) -> float:
        got = canonical_int(parsed)
        if got is None:
            return 0.0
        return right_aligned_match(got, example.answer)


@register_task
class Addition(_BinaryArithmetic):
    name = "addition"
    op = "+"
    names = ("add", "sum", "addition", "additions", "adds", "adding", "sums", "summing", "plus")

    def max_lengths(self, difficulty: int) -> tuple[int, int]:
        return 2 * difficulty + 1, difficulty + 1      # "a+b", and one carry digit at most

    def _apply(self, a: int, b: int) -> int:
        return a + b


@register_task
class Multiplication(_BinaryArithmetic):
    name = "multiplication"
    op = "*"
    names = ("multiply", "product", "multiplication", "multiplications", "multiplies", "multiplying", "products",
             "times")

    def max_lengths(self, difficulty: int) -> tuple[int, int]:
        return 2 * difficulty + 1, 2 * difficulty      # "a*b"; a product of two d-digit numbers has <= 2d digits

    def _apply(self, a: int, b: int) -> int:
        return a * b
