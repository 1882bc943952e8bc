"""A user's own TRL `GRPOTrainer` script, steered by the swarm through one line. TRL is not a
dependency of the swarm itself: it comes with the `test` and `bench` extras (`pip install -e .[test]`,
which scripts/bootstrap.sh runs).

The policy is a tiny Qwen2 built from a config (random weights, nothing downloaded). The tokenizer
is character-level and built here with the `tokenizers` library. The task is to answer "a+b=" with
the sum. The reward is verifiable and graded: each correct leading digit earns a share of the
reward, so a random policy already sees some variance within a group. An exact match scores 1.
It runs on a CPU in seconds per few steps. The completion length (`max_completion_length`) and the
sampling temperature are hot settings here: TRL keeps them on the trainer and reads them at each
generation, so `SwarmCallback` changes them at a step end. `num_generations` and the rest are
restart settings (trl #2941).

    .venv/bin/python examples/steer/grpo_trl.py --output_dir /tmp/grpo-add --max_steps 40
    .venv/bin/python -m trainer.steer.relaunch --run-dir /tmp/grpo-add/swarm -- \\
        .venv/bin/python examples/steer/grpo_trl.py --output_dir /tmp/grpo-add --max_steps 40

Every `GRPOConfig` field is a flag (`HfArgumentParser`; when a flag is given twice, the last one
wins). `--resume_from_checkpoint PATH` resumes. The run folder is `--run_dir`, else
`$SWARMLAB_RUN_DIR`, else `<output_dir>/swarm`.
"""
from __future__ import annotations

import dataclasses
import sys

import numpy as np
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (GenerationConfig, HfArgumentParser, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM,
                          TrainerCallback)
from trl import GRPOConfig, GRPOTrainer

from trainer.steer import steer

SPECIALS = ["<pad>", "<bos>", "<eos>"]
CHARS = "0123456789+="


@dataclasses.dataclass
class ScriptArguments:
    run_dir: str | None = dataclasses.field(default=None, metadata={"help": "the swarm's run folder (default: "
                                            "$SWARMLAB_RUN_DIR, else <output_dir>/swarm)"})
    digits: int = dataclasses.field(default=1, metadata={"help": "digits per operand"})
    train_size: int = dataclasses.field(default=256, metadata={"help": "training prompts"})
    eval_size: int = dataclasses.field(default=64, metadata={"help": "held-out prompts (evaluated every --eval_steps "
                                                                    "when --eval_strategy steps; 0: no eval set)"})
    d_model: int = dataclasses.field(default=32, metadata={"help": "hidden size of the tiny Qwen2"})
    n_layers: int = dataclasses.field(default=1, metadata={"help": "decoder layers"})


def char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(SPECIALS + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")   # one token per character
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   padding_side="left")


def tiny_policy(tok: PreTrainedTokenizerFast, d_model: int, n_layers: int, seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=d_model, intermediate_size=2 * d_model,
                      num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id)
    return model


def problems(digits: int, n: int, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 10 ** digits, size=(2, n))
    return Dataset.from_dict({"prompt": [f"{x}+{y}=" for x, y in zip(a, b)], "answer": [str(x + y) for x, y in zip(a, b)]})


def digits_right(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """Leading characters right over the longer of answer and completion (1.0: exact)."""
    out = []
    for c, want in zip(completions, answer):
        c = c.replace(" ", "")   # the character tokenizer decodes with a space between tokens
        n = 0
        while n < min(len(c), len(want)) and c[n] == want[n]:
            n += 1
        out.append(n / max(len(want), len(c)))
    return out


def exact(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """1.0 when the completion is the answer exactly. Weighted 0 in training (the graded reward
    trains); its held-out mean is the script's accuracy."""
    return [float(c.replace(" ", "") == want) for c, want in zip(completions, answer)]


class EvalAccuracy(TrainerCallback):
    """TRL logs each reward function's held-out mean as `eval_rewards/<name>/mean`; this names the
    exact-match one `eval_accuracy`, the metric a goal reads (as `heldout_acc`). It runs before
    SwarmCallback, which sees the same log dict."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "eval_rewards/exact/mean" in logs:
            logs["eval_accuracy"] = logs["eval_rewards/exact/mean"]


def parser() -> HfArgumentParser:
    p = HfArgumentParser((ScriptArguments, GRPOConfig))
    p.set_defaults(output_dir="runs/steer-grpo", max_steps=40, per_device_train_batch_size=8, num_generations=4,
                   max_completion_length=4, learning_rate=1e-3, logging_steps=1, save_strategy="steps", save_steps=20,
                   report_to="none", use_cpu=True, bf16=False, activation_checkpointing=False, use_vllm=False,
                   disable_tqdm=True, dataloader_num_workers=0, log_completions=False, reward_weights=[1.0, 0.0],
                   per_device_eval_batch_size=64, eval_steps=20)
    return p


def build(script: ScriptArguments, args: GRPOConfig) -> GRPOTrainer:
    tok = char_tokenizer()
    held = problems(script.digits, script.eval_size, seed=2) if script.eval_size else None
    trainer = GRPOTrainer(model=tiny_policy(tok, script.d_model, script.n_layers, args.seed),
                          reward_funcs=[digits_right, exact], args=args,
                          train_dataset=problems(script.digits, script.train_size, seed=1), eval_dataset=held,
                          processing_class=tok, callbacks=[EvalAccuracy()])
    steer(trainer, script.run_dir)   # the one line a user adds
    return trainer


def main(argv: list[str] | None = None) -> int:
    script, args = parser().parse_args_into_dataclasses(args=argv)
    build(script, args).train(resume_from_checkpoint=args.resume_from_checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
