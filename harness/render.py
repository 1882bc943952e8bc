"""Rendering and parsing: how a single-turn harness writes the prompt and the reference completion,
and how it reads the answer back out of a completion, as text and as token ids.

    text, ids = prompt(tok, spec, "12+34")       # "12+34=", [bos] + encode("12+34=")
    sft_target(spec, "46")                        # "64\n" with reverse_digits and stop "\n"
    extract_answer(spec.answer, "64\n")           # "46"

The text-level functions are what `HarnessSpec.render`, `AnswerFormat.extract` and
`AnswerFormat.render` call; the token-level ones take any tokenizer with `encode`, `bos_id` and
`eos_id` (the trainer's `Tokenizer` protocol), so the harness never imports the trainer.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from harness.spec import AnswerFormat, HarnessSpec


class Encoder(Protocol):
    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...


# ---- text ------------------------------------------------------------------------------------
def render_prompt(template: str, question: str) -> str:
    """The prompt: the template with the question in its `{question}` placeholder."""
    return template.format(question=question)


def extract_answer(fmt: AnswerFormat, completion: str) -> str | None:
    """The answer `fmt` reads from `completion`: the last match of its regex in the text up to and
    including the first stop string (the stop may close the pattern), stripped; digits reversed
    back when the format writes them reversed. None when nothing (or only space) matches."""
    text = completion
    if fmt.stop and fmt.stop in text:
        text = text[: text.index(fmt.stop) + len(fmt.stop)]
    matches = re.findall(fmt.regex, text, re.S)
    if not matches:
        return None
    ans = matches[-1].strip()
    if not ans:
        return None
    return ans[::-1] if fmt.reverse_digits else ans


def render_answer(fmt: AnswerFormat, answer: str) -> str:
    """The completion a perfect policy writes for `answer` under `fmt`."""
    body = answer[::-1] if fmt.reverse_digits else answer
    return fmt.prefix + body + (fmt.stop or "")


def fewest_to_read(fmt: AnswerFormat, answer: str) -> int | None:
    """The fewest characters of the completion a perfect policy writes for `answer` (`render_answer`)
    from which `extract_answer` reads `answer` back: what an answer limit must let through for it to
    be right; None when even the whole completion does not read back."""
    text = render_answer(fmt, answer)
    return next((k for k in range(1, len(text) + 1) if extract_answer(fmt, text[:k]) == answer), None)


def sft_target(spec: HarnessSpec, label: str) -> str:
    """The SFT target completion for a reference answer (or solution) `label`."""
    return render_answer(spec.answer, label)


# ---- token ids -------------------------------------------------------------------------------
def prompt(tok: Encoder, spec: HarnessSpec, question: str) -> tuple[str, list[int]]:
    """(prompt text, its token ids after the BOS token)."""
    text = render_prompt(spec.template, question)
    return text, [tok.bos_id] + tok.encode(text)


def stop_ids(tok: Encoder, spec: HarnessSpec) -> set[int]:
    """The token ids that end generation: the stop string's, when it is one token; else none (a
    multi-token stop ends the completion only through `max_new_tokens` and the answer regex)."""
    stop = spec.answer.stop
    if not stop:
        return set()
    ids = tok.encode(stop)
    return {ids[0]} if len(ids) == 1 else set()


def target_ids(tok: Encoder, spec: HarnessSpec, completion_text: str) -> list[int]:
    """Token ids of a target completion; with no stop string the EOS token closes it."""
    ids = tok.encode(completion_text)
    if not spec.answer.stop:
        ids.append(tok.eos_id)
    return ids
