"""harness/render.py: prompts, SFT targets and answer parsing, as text and as token ids, on the
character tokenizer; the spec's methods are the same functions.

    .venv/bin/python -m pytest tests/test_harness_render.py -q
"""
from __future__ import annotations

import pytest

from harness import render
from harness.spec import AnswerFormat, HarnessSpec
from trainer.tokenizer import CharTokenizer

TOK = CharTokenizer()


def test_prompt_is_bos_then_the_rendered_template():
    spec = HarnessSpec(template="Q: {question}\nA:")
    text, ids = render.prompt(TOK, spec, "12+34")
    assert text == "Q: 12+34\nA:" == spec.render("12+34")
    assert ids == [TOK.bos_id] + TOK.encode(text)
    assert render.render_prompt("{question:.3}=", "12+34") == "12+=" == HarnessSpec(template="{question:.3}=").render("12+34")


@pytest.mark.parametrize("stop, want", [("\n", {TOK.encode("\n")[0]}), ("</a>", set()), (None, set())])
def test_stop_ids_only_for_a_one_token_stop(stop, want):
    assert render.stop_ids(TOK, HarnessSpec(answer={"stop": stop})) == want


def test_target_ids_close_with_eos_only_without_a_stop():
    assert render.target_ids(TOK, HarnessSpec(), "46\n") == TOK.encode("46\n")
    assert render.target_ids(TOK, HarnessSpec(answer={"stop": None}), "46") == TOK.encode("46") + [TOK.eos_id]


@pytest.mark.parametrize("fmt, label, target", [
    ({}, "46", "46\n"),
    ({"reverse_digits": True}, "123", "321\n"),
    ({"regex": r"<a>(.*?)</a>", "stop": "</a>", "prefix": "<a>"}, "x y", "<a>x y</a>"),
    ({"stop": None}, "7", "7"),
])
def test_sft_target_round_trips_through_the_parser(fmt, label, target):
    spec = HarnessSpec(answer=fmt)
    assert render.sft_target(spec, label) == target == spec.answer.render(label)
    assert render.extract_answer(spec.answer, target) == label == spec.answer.extract(target)


@pytest.mark.parametrize("fmt, completion, want", [
    ({}, " 46 \n", "46"),
    ({}, "46 47\n", None),                                   # the default regex takes one word
    ({}, "\n", None),
    ({"regex": r"<a>(.*?)</a>", "stop": "</a>"}, "<a>1</a><a>2</a>", "1"),          # cut at the first stop
    ({"regex": r"<a>(.*?)</a>", "stop": None}, "<a>1</a><a>2</a>", "2"),            # the last match wins
    ({"regex": r"<a>(.*?)</a>", "stop": "</a>"}, "<a>  </a>", None),                # only space: no answer
    ({"reverse_digits": True}, "321\n", "123"),
])
def test_extract_answer_table(fmt, completion, want):
    f = AnswerFormat(**fmt)
    assert render.extract_answer(f, completion) == want == f.extract(completion)
