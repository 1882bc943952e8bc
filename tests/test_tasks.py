"""Task families: verifiers on hand-made answers, generated solutions, splits, determinism.

Answers are extracted the way the trainer does it, with `harness.spec.AnswerFormat`.
"""
from __future__ import annotations

import random

import pytest

from harness.spec import AnswerFormat
from trainer.tasks import TASKS, Example, Split, Task, Verdict, heldout_question, make_task, register_task
from trainer.tasks.countdown import parse_expression

FAMILIES = ["addition", "multiplication", "countdown", "sort", "reverse"]
PLAIN = AnswerFormat()  # one word per line: the default
REVERSED = AnswerFormat(reverse_digits=True)
# `extract` cuts the text at `stop` before matching, so a format whose regex needs the closing tag
# stops only at max_new_tokens: an unclosed answer then extracts nothing.
TAGGED = AnswerFormat(regex=r"<answer>(.*?)</answer>", stop=None)
LINE = AnswerFormat(regex=r"^\s*(.+?)\s*$", stop="\n")  # one line, spaces allowed


def ex(question: str, answer: str, **meta) -> Example:
    return Example(uid="hand", question=question, answer=answer, solution=answer, meta=meta)


def verdict(task: Task, completion: str, example: Example, fmt: AnswerFormat = PLAIN, truncated: bool = False):
    return task.verify(completion, example, fmt.extract, truncated=truncated)


# ---------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("579\n", Verdict.CORRECT),
        ("  579  \nignored", Verdict.CORRECT),
        ("0579", Verdict.CORRECT),
        ("+579", Verdict.CORRECT),
        ("578", Verdict.WRONG),
        ("-579", Verdict.WRONG),
        ("57a", Verdict.MALFORMED),
        ("5_79", Verdict.MALFORMED),  # int() would accept it; the verifier does not
        ("579.0", Verdict.MALFORMED),
        ("", Verdict.MALFORMED),
        ("57 9", Verdict.MALFORMED),  # two words: the default format extracts nothing
    ],
)
def test_addition_verdicts(completion, expected):
    task = make_task("addition")
    res = verdict(task, completion, ex("123+456", "579"))
    assert res.verdict is expected, res
    assert res.reward == (1.0 if expected is Verdict.CORRECT else 0.0)


def test_arithmetic_partial_credit_counts_digits_from_the_right():
    task = make_task("addition")
    e = ex("123+456", "579")
    assert task.partial_credit("579", e) == 1.0
    assert task.partial_credit("479", e) == pytest.approx(2 / 3)
    assert task.partial_credit("79", e) == pytest.approx(2 / 3)
    assert task.partial_credit("1579", e) == pytest.approx(3 / 4)
    assert task.partial_credit("abc", e) == 0.0


def test_multiplication_handles_long_answers_without_int_conversion():
    task = make_task("multiplication")
    e = task.example(Split.TRAIN, 0, 12)
    assert e.question.count("*") == 1
    a, b = map(int, e.question.split("*"))
    assert e.answer == str(a * b)
    assert task.check("9" * 5000, e).verdict is Verdict.WRONG


def test_truncated_only_when_no_answer_could_be_extracted():
    task = make_task("addition")
    e = ex("123+456", "579")
    assert verdict(task, "<answer>57", e, TAGGED, truncated=True).verdict is Verdict.TRUNCATED
    assert verdict(task, "<answer>57", e, TAGGED, truncated=False).verdict is Verdict.MALFORMED
    assert verdict(task, "<answer>579</answer>", e, TAGGED, truncated=True).verdict is Verdict.CORRECT
    assert verdict(task, "<answer>578</answer>", e, TAGGED, truncated=True).verdict is Verdict.WRONG


# ---------------------------------------------------------------- countdown

CD = ex("3 7 25 50->75", "25*3", numbers=[3, 7, 25, 50], target=75)


@pytest.mark.parametrize(
    "answer, expected, detail",
    [
        ("25*3", Verdict.CORRECT, ""),
        ("50+25", Verdict.CORRECT, ""),
        ("(50 + 25)", Verdict.CORRECT, ""),
        ("(50-25)*3", Verdict.CORRECT, ""),
        ("50/(7-3)*3+25-37/2", Verdict.WRONG, "not given"),  # 37 and 2 are not among the numbers
        ("25+25+25", Verdict.WRONG, "uses 25 3 times, given 1"),
        ("75", Verdict.WRONG, "uses 75, which is not given"),
        ("50+7", Verdict.WRONG, "value 57 != target 75"),
        ("50/3", Verdict.WRONG, "value 50/3 != target 75"),
        ("50/(7-7)", Verdict.WRONG, "uses 7 2 times"),
        ("__import__('os')", Verdict.MALFORMED, "characters not allowed"),
        ("2**100000", Verdict.MALFORMED, "Pow is not allowed"),
        ("50//2", Verdict.MALFORMED, "FloorDiv is not allowed"),
        ("-3+78", Verdict.MALFORMED, "UnaryOp is not allowed"),
        ("3(25)", Verdict.MALFORMED, "Call is not allowed"),
        ("(50+25", Verdict.MALFORMED, "not an expression"),
        ("50 25", Verdict.MALFORMED, "not an expression"),
        ("", Verdict.MALFORMED, "not an expression"),
        ("(" * 150 + "3" + ")" * 150, Verdict.MALFORMED, "longer than 200"),
    ],
)
def test_countdown_verdicts(answer, expected, detail):
    res = make_task("countdown").check(answer, CD)
    assert res.verdict is expected, res
    assert detail in res.detail
    assert res.reward == (1.0 if expected is Verdict.CORRECT else 0.0)


def test_countdown_never_executes_the_answer(tmp_path):
    marker = tmp_path / "pwned"
    answers = [
        f"__import__('os').system('touch {marker}')",
        f"open('{marker}', 'w')",
        "[x for x in ().__class__.__base__.__subclasses__()]",
    ]
    task = make_task("countdown")
    for a in answers:
        assert task.check(a, CD).verdict is Verdict.MALFORMED
        assert task.partial_credit(a, CD) == 0.0
    assert not marker.exists()


def test_countdown_exact_arithmetic_and_division_by_zero():
    task = make_task("countdown")
    e = ex("3 4 6->8", "4/3*6", numbers=[3, 4, 6], target=8)
    assert task.check("4/3*6", e).verdict is Verdict.CORRECT
    z = ex("2 2 5->10", "5*2", numbers=[2, 2, 5], target=10)
    res = task.check("5/(2-2)", z)
    assert (res.verdict, res.detail) == (Verdict.WRONG, "division by zero")


def test_countdown_partial_credit():
    task = make_task("countdown")
    assert task.partial_credit("25*3", CD) == 1.0
    assert task.partial_credit("50+7", CD) == pytest.approx(1 - 18 / 75)
    assert task.partial_credit("50*25*3", CD) == 0.0  # farther than the target itself
    assert task.partial_credit("25+25", CD) == 0.0  # invalid use of numbers earns nothing


@pytest.mark.parametrize("difficulty", range(2, 7))
def test_countdown_construction(difficulty):
    task = make_task("countdown")
    for i in range(50):
        e = task.example(Split.TRAIN, i, difficulty)
        nums, target = e.meta["numbers"], e.meta["target"]
        assert len(nums) == difficulty and all(1 <= n <= 25 for n in nums)
        assert 1 <= target <= 999 and isinstance(target, int)
        assert e.question == " ".join(map(str, nums)) + f"->{target}"
        _, literals = parse_expression(e.solution)
        assert sorted(literals) == sorted(nums), "the solution uses every number once"
        assert set(e.question + e.solution) <= set(task.charset)


def test_countdown_options_are_validated():
    with pytest.raises(ValueError, match="max_number=1"):
        make_task("countdown", max_number=1)
    with pytest.raises(ValueError, match="max_target=5"):
        make_task("countdown", max_target=5)
    small = make_task("countdown", max_number=9, max_target=50)
    for i in range(30):
        e = small.example(Split.TRAIN, i, 5)
        assert max(e.meta["numbers"]) <= 9 and e.meta["target"] <= 50


# ---------------------------------------------------------------- sequences


@pytest.mark.parametrize(
    "name, question, answer", [("sort", "s:312", "123"), ("reverse", "r:312", "213")]
)
def test_sequence_verdicts(name, question, answer):
    task = make_task(name)
    e = ex(question, answer)
    assert task.check(answer, e).verdict is Verdict.CORRECT
    wrong = answer[1:] + answer[0]
    assert task.check(wrong, e).verdict is Verdict.WRONG
    assert "length" in task.check(answer + "1", e).detail
    for bad in ("1,2,3", "1 2 3", "abc", "１２３"):
        assert task.check(bad, e).verdict is Verdict.MALFORMED
    assert task.partial_credit(answer, e) == 1.0
    assert task.partial_credit(answer[:2] + "9", e) == pytest.approx(2 / 3)
    assert task.partial_credit(answer + "99", e) == pytest.approx(3 / 5)
    assert task.partial_credit("x", e) == 0.0


def test_sequence_questions():
    for name, prefix in (("sort", "s:"), ("reverse", "r:")):
        task = make_task(name)
        e = task.example(Split.TRAIN, 3, 7)
        assert e.question.startswith(prefix) and len(e.question) == len(prefix) + 7
        digits = e.question[len(prefix):]
        assert e.answer == ("".join(sorted(digits)) if name == "sort" else digits[::-1])


# ---------------------------------------------------------------- all families


def _cases():
    for name in FAMILIES:
        cls = TASKS[name]
        for d in range(cls.min_difficulty, cls.max_difficulty + 1):
            yield name, d


@pytest.mark.parametrize("name, difficulty", list(_cases()))
def test_generated_solutions_score_correct(name, difficulty):
    task = make_task(name, seed=7)
    for i in range(50):
        e = task.example(Split.TRAIN, i, difficulty)
        target = e.solution or e.answer
        for fmt in (PLAIN, REVERSED):
            res = verdict(task, fmt.render(target), e, fmt)
            assert res.verdict is Verdict.CORRECT and res.reward == 1.0, (e, res)
        assert task.partial_credit(target, e) == 1.0
        ref = task.reference(e)       # the answer worked out again from the question agrees with the stored one
        assert ref is None or task.check(target, ref).verdict is Verdict.CORRECT, (e, ref)
        assert e.uid == f"{name}/train/d{difficulty}/{i}" and e.difficulty == difficulty
        assert set(e.question + target) <= set(task.charset), e


@pytest.mark.parametrize("name", FAMILIES)
def test_train_and_heldout_are_disjoint(name):
    task = make_task(name)
    for d in (task.min_difficulty, task.min_difficulty + 1):
        train = {task.example(Split.TRAIN, i, d).question for i in range(400)}
        held = {task.example(Split.HELDOUT, i, d).question for i in range(100)}
        assert train and held and not train & held
        assert not any(heldout_question(q) for q in train) and all(heldout_question(q) for q in held)


@pytest.mark.parametrize("name", FAMILIES)
def test_examples_are_deterministic(name):
    a, b, other = make_task(name, seed=1), make_task(name, seed=1), make_task(name, seed=2)
    d = a.max_difficulty
    assert a.example("train", 5, d) == b.example(Split.TRAIN, 5, d)
    assert a.example("heldout", 5, d) == b.example("heldout", 5, d)
    assert a.example("train", 5, d).question != other.example("train", 5, d).question
    assert a.example("train", 5, d).question != a.example("train", 6, d).question


@pytest.mark.parametrize("name", FAMILIES)
def test_difficulty_out_of_range(name):
    task = make_task(name)
    for d in (task.min_difficulty - 1, task.max_difficulty + 1):
        with pytest.raises(ValueError, match=f"difficulty={d}"):
            task.example(Split.TRAIN, 0, d)


def test_unknown_task_and_options():
    with pytest.raises(ValueError, match="unknown task 'nope'.*addition"):
        make_task("nope")
    with pytest.raises(ValueError, match="unknown options"):
        make_task("addition", digits=3)
    with pytest.raises(ValueError, match="registered twice"):
        register_task(TASKS["addition"])


class _OneQuestion(Task):
    """Unregistered: a family whose question space is a single question."""

    name = "one_question"

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def make(self, rng: random.Random, difficulty: int) -> Example:
        return Example(uid="", question=self.question, answer="1")

    def check(self, parsed, example):
        return make_task("addition").check(parsed, example)


def test_base_default_partial_credit_and_tiny_question_space():
    q = next(f"q{i}" for i in range(1000) if not heldout_question(f"q{i}"))
    task = _OneQuestion(q)
    e = task.example(Split.TRAIN, 0, 1)
    assert task.partial_credit("1", e) == 1.0 and task.partial_credit("2", e) == 0.0
    with pytest.raises(ValueError, match="no heldout question"):
        task.example(Split.HELDOUT, 0, 1)


# ---------------------------------------------------------------- reasoning-gym


@pytest.fixture(scope="module")
def rg_arith():
    return make_task("rg", dataset="basic_arithmetic", seed=3)


def test_rg_solutions_score_correct_and_difficulty_follows_curriculum(rg_arith):
    task = rg_arith
    assert task.max_difficulty == 5  # basic_arithmetic: num_terms has 5 levels
    assert task.knobs(1)["max_terms"] == 2 and task.knobs(5)["max_terms"] == 6
    assert task.knobs(5)["min_terms"] == 2  # reasoning-gym's inclusive ranges keep the easy end
    fmt = LINE
    for d in (1, 5):
        for i in range(10):
            e = task.example(Split.TRAIN, i, d)
            assert 2 <= e.meta["entry"]["metadata"]["num_terms"] <= d + 1
            assert verdict(task, fmt.render(e.solution), e, fmt).verdict is Verdict.CORRECT
            wrong = str(int(e.answer) + 1)
            res = verdict(task, f"<answer>{wrong}</answer>", e, TAGGED)
            assert res.verdict is Verdict.WRONG and res.reward == 0.0
            assert task.partial_credit(wrong, e) < 1.0
    with pytest.raises(ValueError, match="difficulty=6"):
        task.example(Split.TRAIN, 0, 6)


def test_rg_splits_and_determinism(rg_arith):
    train = {rg_arith.example(Split.TRAIN, i, 3).question for i in range(40)}
    held = {rg_arith.example(Split.HELDOUT, i, 3).question for i in range(20)}
    assert not train & held
    again = make_task("rg", dataset="basic_arithmetic", seed=3)
    assert again.example(Split.TRAIN, 4, 3) == rg_arith.example(Split.TRAIN, 4, 3)


def test_rg_second_dataset_with_user_option():
    task = make_task("rg", dataset="spell_backward", max_word_len=5)
    assert task.knobs(task.max_difficulty)["max_word_len"] == 5  # the user's option wins
    for i in range(10):
        e = task.example(Split.TRAIN, i, 1)
        assert task.check(e.answer, e).verdict is Verdict.CORRECT
        assert task.check(e.answer[::-1] + "x", e).verdict is Verdict.WRONG


def test_rg_bad_options():
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset 'basic_arith'.*basic_arithmetic"):
        make_task("rg", dataset="basic_arith")
    with pytest.raises(ValueError, match="'dataset' is required"):
        make_task("rg")
    with pytest.raises(ValueError, match="no config field 'digits'"):
        make_task("rg", dataset="basic_arithmetic", digits=3)
    with pytest.raises(ValueError, match="'size' is set by the adapter"):
        make_task("rg", dataset="basic_arithmetic", size=3)
    with pytest.raises(ValueError, match="rejects its config"):
        make_task("rg", dataset="basic_arithmetic", min_terms=0)


class _RaisingScorer:
    """Stands in for a reasoning-gym dataset whose scorer chokes on an answer."""

    def score_answer(self, answer, entry):
        raise KeyError("metadata")


def test_rg_scorer_failure_becomes_malformed(rg_arith):
    e = rg_arith.example(Split.TRAIN, 0, 2)
    task = make_task("rg", dataset="basic_arithmetic", seed=3)
    task._scorers[2] = _RaisingScorer()
    res = task.check(e.answer, e)
    assert res.verdict is Verdict.MALFORMED and "KeyError" in res.detail
    assert task.partial_credit(e.answer, e) == 0.0


def test_rg_difficulty_stops_where_the_dataset_rejects_its_curriculum():
    # reasoning-gym 0.1.25's caesar_cipher curriculum has 4 levels; rotations above 25 (level 3)
    # fail the dataset's own validation, so the adapter offers only the levels that build.
    from reasoning_gym.factory import CURRICULA

    task = make_task("rg", dataset="caesar_cipher")
    levels = max(len(a.levels) for a in CURRICULA["caesar_cipher"]().attributes.values())
    assert 1 <= task.max_difficulty < levels
    for d in range(1, task.max_difficulty + 1):
        e = task.example(Split.TRAIN, 0, d)
        assert task.check(e.answer, e).verdict is Verdict.CORRECT
