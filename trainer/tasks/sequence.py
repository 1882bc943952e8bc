"""Digit-sequence transformations: `sort` ("s:312" -> "123", ascending) and `reverse`
("r:312" -> "213").

The sequence is a string of decimal digits (repeats allowed), written without separators so that
one character is one token for the built-in model and the answer is a single word for the default
answer format. Difficulty is the length of the sequence (2..12). An answer that is not all digits
is MALFORMED; any other mismatch (a wrong length included) is WRONG. Partial credit is the share
of positions that match, over the longer of answer and truth.
"""
from __future__ import annotations

import dataclasses
import random
from typing import ClassVar

from trainer.tasks.base import Example, Task, Verdict, VerifyResult, register_task


def position_match(parsed: str, truth: str) -> float:
    """Share of positions, aligned from the left, where the strings agree (over the longer one)."""
    n = max(len(parsed), len(truth))
    if n == 0:
        return 1.0
    return sum(a == b for a, b in zip(parsed, truth)) / n


class _DigitSequence(Task):
    prefix: ClassVar[str]
    min_difficulty = 2
    max_difficulty = 12
    charset: ClassVar[str] = "0123456789sr:"
    answer_is_shortest: ClassVar[bool] = True   # the one digit sequence, compared exactly
    words = ("list", "lists", "sequence", "sequences", "string", "strings", "digit", "digits", "array", "arrays")
    difficulty_patterns = (
        r"(\d+)[- ](?:digits?|elements?|items?|characters?)\b",
        r"\b(?:lists?|sequences?|strings?|arrays?) of (?:length )?(\d+)\b",
        r"\blength (?:of )?(\d+)\b",
    ) + Task.difficulty_patterns
    difficulty_label = "length {d}"

    def max_lengths(self, difficulty: int) -> tuple[int, int]:
        return difficulty + 2, difficulty              # "s:" + the digits; the answer is as long

    def _transform(self, digits: str) -> str:
        raise NotImplementedError

    def make(self, rng: random.Random, difficulty: int) -> Example:
        digits = "".join(rng.choice("0123456789") for _ in range(difficulty))
        return Example(uid="", question=f"{self.prefix}:{digits}", answer=self._transform(digits))

    def reference(self, example: Example) -> Example | None:
        head, sep, digits = example.question.partition(":")
        if head != self.prefix or not sep or not (digits.isascii() and digits.isdigit()):
            return None
        return dataclasses.replace(example, answer=self._transform(digits), solution=None)

    def check(self, parsed: str, example: Example) -> VerifyResult:
        if not (parsed.isascii() and parsed.isdigit()):
            return VerifyResult(0.0, Verdict.MALFORMED, parsed, "answer is not a digit sequence")
        if parsed == example.answer:
            return VerifyResult(1.0, Verdict.CORRECT, parsed)
        if len(parsed) != len(example.answer):
            return VerifyResult(0.0, Verdict.WRONG, parsed, f"length {len(parsed)} != {len(example.answer)}")
        wrong = sum(a != b for a, b in zip(parsed, example.answer))
        return VerifyResult(0.0, Verdict.WRONG, parsed, f"{wrong} of {len(parsed)} positions wrong")

    def partial_credit(self, parsed: str, example: Example) -> float:
        parsed = parsed.strip()
        if not (parsed.isascii() and parsed.isdigit()):
            return 0.0
        return position_match(parsed, example.answer)


@register_task
class Sort(_DigitSequence):
    name = "sort"
    prefix = "s"
    names = ("sort", "ascending", "sorts", "sorted", "sorting", "sorter")

    def _transform(self, digits: str) -> str:
        return "".join(sorted(digits))


@register_task
class Reverse(_DigitSequence):
    name = "reverse"
    prefix = "r"
    names = ("reverse", "backwards", "reverses", "reversed", "reversing", "reversal")

    def _transform(self, digits: str) -> str:
        return digits[::-1]
