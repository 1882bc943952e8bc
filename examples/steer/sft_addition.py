"""A user's own SFT script on a plain `transformers.Trainer`, steered by the swarm through one line.

The model is a tiny Qwen2 built from a config (random weights, nothing downloaded). It learns
N-digit addition ("37+45=" → "82"), character by character. The loss is taken on the answer and
its end token only. The held-out metric is exact match (`eval_accuracy`, written as
`heldout_acc`). It is computed under teacher forcing: every answer token is the argmax. That is
exactly what greedy decoding would produce, so the metric needs no generation loop. It runs on a
CPU in seconds per few dozen steps.

Run it on its own (the callback writes `<output_dir>/swarm`, or `$SWARMLAB_RUN_DIR`):

    .venv/bin/python examples/steer/sft_addition.py --output_dir /tmp/sft-add --max_steps 200

Run it under the relauncher. The relauncher relaunches the script from the checkpoint after a
restart-required change, and resumes it after a crash:

    .venv/bin/python -m trainer.steer.relaunch --run-dir /tmp/sft-add/swarm -- \\
        .venv/bin/python examples/steer/sft_addition.py --output_dir /tmp/sft-add --max_steps 200

Settings come from the command line, as in most Hugging Face scripts: `HfArgumentParser` reads
this script's own arguments (`ScriptArguments`) and every `TrainingArguments` field
(`--learning_rate 3e-3`, `--per_device_train_batch_size 16`, …). When a flag is given twice, the
last one wins. That is how the relauncher applies a change: it appends the flag.
`--resume_from_checkpoint PATH` resumes from a Trainer checkpoint. The run folder comes from
`--run_dir`, else `$SWARMLAB_RUN_DIR`, else `<output_dir>/swarm`.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np
import torch
from transformers import EvalPrediction, HfArgumentParser, Qwen2Config, Qwen2ForCausalLM, Trainer, TrainingArguments

from trainer.steer import steer

PAD, BOS, EOS = 0, 1, 2
CHARS = "0123456789+="
VOCAB = 3 + len(CHARS)
IGNORE = -100


@dataclasses.dataclass
class ScriptArguments:
    run_dir: str | None = dataclasses.field(default=None, metadata={"help": "the swarm's run folder (default: "
                                            "$SWARMLAB_RUN_DIR, else <output_dir>/swarm)"})
    digits: int = dataclasses.field(default=2, metadata={"help": "digits per operand"})
    train_size: int = dataclasses.field(default=4096, metadata={"help": "training problems"})
    eval_size: int = dataclasses.field(default=256, metadata={"help": "held-out problems (none in the training set)"})
    d_model: int = dataclasses.field(default=64, metadata={"help": "hidden size of the tiny Qwen2"})
    n_layers: int = dataclasses.field(default=2, metadata={"help": "decoder layers"})
    steer: bool = dataclasses.field(default=True, metadata={"help": "attach SwarmCallback (false: a plain run, "
                                                                   "for the overhead benchmark)"})


def encode(text: str) -> list[int]:
    return [3 + CHARS.index(c) for c in text]


class Addition(torch.utils.data.Dataset):
    """`a+b=c` problems, padded to one length. Labels cover the answer and EOS only. The held-out
    split draws (a, b) pairs that the training split does not hold."""

    def __init__(self, digits: int, n: int, seed: int, exclude: set[tuple[int, int]] | None = None) -> None:
        rng = np.random.default_rng(seed)
        hi = 10 ** digits
        if n + len(exclude or ()) > hi * hi:
            raise ValueError(f"{n} problems (+{len(exclude or ())} held apart) do not fit in the {hi * hi} pairs of "
                             f"{digits}-digit numbers")
        self.pairs: list[tuple[int, int]] = []
        seen = set(exclude or ())
        while len(self.pairs) < n:
            a, b = (int(x) for x in rng.integers(0, hi, size=2))
            if (a, b) not in seen:
                seen.add((a, b))
                self.pairs.append((a, b))
        self.length = 2 + (2 * digits + 2) + (digits + 1)   # BOS, "a+b=", the answer, EOS

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        a, b = self.pairs[i]
        prompt, answer = [BOS] + encode(f"{a}+{b}="), encode(str(a + b)) + [EOS]
        ids = prompt + answer + [PAD] * (self.length - len(prompt) - len(answer))
        labels = [IGNORE] * len(prompt) + answer + [IGNORE] * (self.length - len(prompt) - len(answer))
        mask = [1] * (len(prompt) + len(answer)) + [0] * (self.length - len(prompt) - len(answer))
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask), "labels": torch.tensor(labels)}


def tiny_qwen2(d_model: int, n_layers: int, seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=d_model, intermediate_size=2 * d_model, num_hidden_layers=n_layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg)


def argmax_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return logits.argmax(-1)   # (B, T): keeps the eval loop from holding every logit


def exact_match(p: EvalPrediction) -> dict[str, float]:
    pred, labels = np.asarray(p.predictions), np.asarray(p.label_ids)   # (N, T) each
    pred, labels = pred[:, :-1], labels[:, 1:]   # the logit at t predicts token t + 1
    ok = (pred == labels) | (labels == IGNORE)
    return {"accuracy": float(ok.all(axis=1).mean())}


# this script's defaults for the Trainer (any flag on the command line wins); sft_trl.py trains with the same
TRAINER_DEFAULTS: dict[str, Any] = dict(
    output_dir="runs/steer-sft", max_steps=300, per_device_train_batch_size=32, per_device_eval_batch_size=256,
    learning_rate=3e-3, lr_scheduler_type="cosine", warmup_steps=10, weight_decay=0.01, logging_steps=1,
    eval_strategy="steps", eval_steps=50, save_strategy="steps", save_steps=50, report_to="none", use_cpu=True,
    disable_tqdm=True, dataloader_num_workers=0)


def parser() -> HfArgumentParser:
    p = HfArgumentParser((ScriptArguments, TrainingArguments))
    p.set_defaults(**TRAINER_DEFAULTS)
    return p


def build(script: ScriptArguments, args: TrainingArguments, callbacks: list[Any] | None = None) -> Trainer:
    """The Trainer this script trains, with SwarmCallback attached unless `script.steer` is false."""
    train = Addition(script.digits, script.train_size, seed=1)
    held = Addition(script.digits, script.eval_size, seed=2, exclude=set(train.pairs))
    trainer = Trainer(model=tiny_qwen2(script.d_model, script.n_layers, args.seed), args=args, train_dataset=train,
                      eval_dataset=held, compute_metrics=exact_match, preprocess_logits_for_metrics=argmax_logits,
                      callbacks=callbacks)
    if script.steer:
        # the one line a user adds; a plain Trainer has no algorithm of its own to report, and the
        # swarm's SFT detectors (a loss that does not fall) read the label
        steer(trainer, script.run_dir, algorithm="sft")
    return trainer


def main(argv: list[str] | None = None) -> int:
    script, args = parser().parse_args_into_dataclasses(args=argv)
    trainer = build(script, args)
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
