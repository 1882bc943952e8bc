"""Procedural, verifiable task families.

Built in: `addition`, `multiplication` (arithmetic.py), `countdown` (countdown.py), `sort`,
`reverse` (sequence.py), and `rg`, an adapter for the reasoning-gym datasets (reasoning_gym.py).
Importing this package registers them all; `make_task(name, seed, **options)` builds one.

    from trainer.tasks import Split, make_task
    task = make_task("countdown")
    ex = task.example(Split.TRAIN, index=0, difficulty=4)
"""
from trainer.tasks.base import (
    HELDOUT_FRACTION,
    TASKS,
    Example,
    Extractor,
    Split,
    Task,
    Verdict,
    VerifyResult,
    heldout_question,
    make_task,
    register_task,
)
from trainer.tasks import arithmetic, countdown, reasoning_gym, sequence  # noqa: F401  (register)

__all__ = [
    "HELDOUT_FRACTION",
    "TASKS",
    "Example",
    "Extractor",
    "Split",
    "Task",
    "Verdict",
    "VerifyResult",
    "heldout_question",
    "make_task",
    "register_task",
]
from trainer.tasks import code  # noqa: F401
