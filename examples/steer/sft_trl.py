"""A user's own TRL `SFTTrainer` script, steered by the swarm through one line. TRL is not a
dependency of the swarm itself: it comes with the `test` and `bench` extras (`pip install -e .[test]`,
which scripts/bootstrap.sh runs).

The task, the model and the held-out metric are those of `sft_addition.py` (imported from it, so
both scripts train on the same problems): a tiny Qwen2 built from a config (random weights,
nothing downloaded) learns N-digit addition ("37+45=" → "82"), character by character. Here the
data is what SFTTrainer takes from a user: a `datasets.Dataset` of prompt-completion text, read by
a character-level tokenizer built with the `tokenizers` library (its ids are `sft_addition`'s).
SFTTrainer tokenizes it, appends the end token to each completion and takes the loss on the
completion only. The held-out metric is exact match (`eval_accuracy`, written as `heldout_acc`),
computed under teacher forcing as in `sft_addition.py`. TRL 1.x computes its loss from a fused LM
head that builds no logits, so for this metric its evaluation runs each batch forward once more
(deprecated in TRL, with a FutureWarning); training pays nothing for it.

No `algorithm` is passed to `steer`: the callback labels the metrics rows `sft` from the trainer
class, which the swarm's SFT detectors read. It runs on a CPU in seconds per few dozen steps.

    .venv/bin/python examples/steer/sft_trl.py --output_dir /tmp/sft-trl --max_steps 200
    .venv/bin/python -m trainer.steer.relaunch --run-dir /tmp/sft-trl/swarm -- \\
        .venv/bin/python examples/steer/sft_trl.py --output_dir /tmp/sft-trl --max_steps 200

Every `SFTConfig` field is a flag (`HfArgumentParser`; when a flag is given twice, the last one
wins), with `sft_addition.py`'s defaults for the ones both scripts set; its own arguments are
`sft_addition.py`'s (`--digits`, `--train_size`, `--eval_size`, `--d_model`, `--n_layers`, `--steer`,
`--run_dir`). `--resume_from_checkpoint PATH` resumes. The run folder is `--run_dir`, else
`$SWARMLAB_RUN_DIR`, else `<output_dir>/swarm`.
"""
from __future__ import annotations

import pathlib
import sys
import warnings
from typing import Any

from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import HfArgumentParser, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

from trainer.steer import steer

HERE = str(pathlib.Path(__file__).resolve().parent)
if HERE not in sys.path:   # run as a script it is there already; loaded by path (a test, a benchmark) it is not
    sys.path.insert(0, HERE)
from sft_addition import (BOS, CHARS, EOS, PAD, TRAINER_DEFAULTS, Addition, ScriptArguments,  # noqa: E402
                          argmax_logits, exact_match, tiny_qwen2)

SPECIALS = {PAD: "<pad>", BOS: "<bos>", EOS: "<eos>"}
# the held-out metric's extra forward pass (module docstring) is known here: no warning at every evaluation
warnings.filterwarnings("ignore", message="`return_outputs=True`", category=FutureWarning)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, with the ids of `sft_addition.encode` (specials first)."""
    vocab = {t: i for i, t in SPECIALS.items()} | {c: len(SPECIALS) + i for i, c in enumerate(CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=SPECIALS[PAD]))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=SPECIALS[PAD], bos_token=SPECIALS[BOS],
                                   eos_token=SPECIALS[EOS])


def prompt_completion(problems: Addition, tok: PreTrainedTokenizerFast) -> Dataset:
    """The problems as SFTTrainer's prompt-completion text: "<bos>37+45=" → "82" (it adds "<eos>")."""
    return Dataset.from_dict({"prompt": [f"{tok.bos_token}{a}+{b}=" for a, b in problems.pairs],
                              "completion": [str(a + b) for a, b in problems.pairs]})


def parser() -> HfArgumentParser:
    p = HfArgumentParser((ScriptArguments, SFTConfig))
    # TRL's own defaults turn on bf16 and activation checkpointing, which a tiny model on a CPU does not want
    p.set_defaults(**{**TRAINER_DEFAULTS, "output_dir": "runs/steer-sft-trl", "bf16": False,
                      "activation_checkpointing": False})
    return p


def build(script: ScriptArguments, args: SFTConfig, callbacks: list[Any] | None = None) -> SFTTrainer:
    """The SFTTrainer this script trains, with SwarmCallback attached unless `script.steer` is false."""
    tok = char_tokenizer()
    train = Addition(script.digits, script.train_size, seed=1)
    held = Addition(script.digits, script.eval_size, seed=2, exclude=set(train.pairs))
    trainer = SFTTrainer(model=tiny_qwen2(script.d_model, script.n_layers, args.seed), args=args,
                         train_dataset=prompt_completion(train, tok), eval_dataset=prompt_completion(held, tok),
                         processing_class=tok, compute_metrics=exact_match,
                         preprocess_logits_for_metrics=argmax_logits, callbacks=callbacks)
    if script.steer:
        steer(trainer, script.run_dir)   # the one line a user adds
    return trainer


def main(argv: list[str] | None = None) -> int:
    script, args = parser().parse_args_into_dataclasses(args=argv)
    build(script, args).train(resume_from_checkpoint=args.resume_from_checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
