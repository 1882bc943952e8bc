"""A user's own TRL `GRPOTrainer` script, steered by the swarm through one line. TRL is not a
dependency of the swarm itself: it comes with the `test` and `bench` extras (`pip install -e .[test]`,
which scripts/bootstrap.sh runs).

The task: write a string of digits backwards ("3841=" → "1483", then the end token). The policy
is a tiny Qwen2 built from a config (random weights, nothing downloaded). The tokenizer is
character-level and built here with the `tokenizers` library.

A random policy never writes a whole answer, so every group would score the same and GRPO would
have no signal. The script therefore starts with a supervised warm-up on generated demonstrations
(`--warmup_sft_steps`, plain teacher forcing, a few CPU-seconds). On this task the warm-up does
most of the learning: after its 100 steps the policy's sampled answers are exactly right on about
0.6-0.8 of held-out prompts (the share depends on the seed: the loss drops sharply between steps
60 and 120). GRPO then trains on two verifiable rewards, weighted alike: `chars_right` (the share
of answer characters in place, so a group rarely scores all alike) and `exact` (a finished
completion, one that ends with the end token, that is the answer). The held-out metric is TRL's
own evaluation: `eval_accuracy`, the held-out mean of `exact`, over `--num_generations_eval`
samples per prompt at the training temperature (`--temperature`, 1.0). The warm-up runs only on a
fresh start; a resumed run (`--resume_from_checkpoint`) has its weights from the checkpoint.

A completion is cut off at `--max_completion_length` tokens. An answer needs `--length` digits and
the end token, so a smaller limit leaves every answer unfinished: `exact` and the held-out
accuracy are 0 (`chars_right` still scores the cut-off characters), and TRL logs the cut-off share
(`completions/clipped_ratio`, train and eval). The limit and the sampling temperature are hot
settings here: TRL keeps them on the trainer and reads them at each generation, so
`SwarmCallback` changes them at a step end. `num_generations` and the rest are restart settings
(trl #2941). It runs on a CPU at a few steps per second.

    .venv/bin/python examples/steer/grpo_trl.py --output_dir /tmp/grpo-rev --max_steps 200
    .venv/bin/python -m trainer.steer.relaunch --run-dir /tmp/grpo-rev/swarm -- \\
        .venv/bin/python examples/steer/grpo_trl.py --output_dir /tmp/grpo-rev --max_steps 200

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
CHARS = "0123456789="
EOS_ID = SPECIALS.index("<eos>")


@dataclasses.dataclass
class ScriptArguments:
    run_dir: str | None = dataclasses.field(default=None, metadata={"help": "the swarm's run folder (default: "
                                            "$SWARMLAB_RUN_DIR, else <output_dir>/swarm)"})
    length: int = dataclasses.field(default=4, metadata={"help": "digits per string"})
    train_size: int = dataclasses.field(default=2048, metadata={"help": "training prompts"})
    eval_size: int = dataclasses.field(default=128, metadata={"help": "held-out prompts, none in the training set "
                                                                     "(evaluated every --eval_steps when "
                                                                     "--eval_strategy steps; 0: no eval set)"})
    d_model: int = dataclasses.field(default=64, metadata={"help": "hidden size of the tiny Qwen2"})
    n_layers: int = dataclasses.field(default=2, metadata={"help": "decoder layers"})
    warmup_sft_steps: int = dataclasses.field(default=100, metadata={"help": "supervised steps on demonstrations "
                                                                           "before GRPO (fresh starts only)"})
    warmup_sft_lr: float = dataclasses.field(default=3e-3, metadata={"help": "learning rate of the warm-up"})


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


def problems(length: int, n: int, seed: int, exclude: frozenset[str] = frozenset()) -> Dataset:
    """`n` distinct prompts "s=" (none in `exclude`), s a string of `length` digits, each with s reversed."""
    if n + len(exclude) > 10 ** length:
        raise ValueError(f"{n} strings (+{len(exclude)} held apart) do not fit in the {10 ** length} strings of "
                         f"{length} digits")
    rng, seen, out = np.random.default_rng(seed), set(exclude), []
    while len(out) < n:
        s = "".join(str(d) for d in rng.integers(0, 10, size=length))
        if s + "=" not in seen:
            seen.add(s + "=")
            out.append(s)
    return Dataset.from_dict({"prompt": [s + "=" for s in out], "answer": [s[::-1] for s in out]})


def finished(ids: list[int]) -> bool:
    return bool(ids) and ids[-1] == EOS_ID


def chars_right(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """The share of answer characters in place, over the longer of answer and completion. A partly
    right answer earns part of the reward, so a group of samples rarely scores all alike; a
    completion that runs on past the answer loses."""
    out = []
    for c, want in zip(completions, answer):
        c = c.replace(" ", "")   # the character tokenizer decodes with a space between tokens
        out.append(sum(a == b for a, b in zip(c, want)) / max(len(want), len(c)))
    return out


def exact(completions: list[str], answer: list[str], completion_ids: list[list[int]], **kwargs) -> list[float]:
    """1.0 for a finished completion that is the answer exactly, else 0: a cut-off completion is
    not an answer, however right its first characters. Its held-out mean is the script's accuracy."""
    return [float(finished(ids) and c.replace(" ", "") == want) for c, want, ids in zip(completions, answer, completion_ids)]


def warm_up(model: Qwen2ForCausalLM, tok: PreTrainedTokenizerFast, data: Dataset, steps: int, lr: float,
            batch: int, seed: int) -> None:
    """Teacher forcing on prompt + answer + end token, the loss on the answer and the end token."""
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        rows = data.select(rng.integers(0, len(data), size=batch))
        prompts = [tok(p)["input_ids"] for p in rows["prompt"]]
        answers = [tok(a)["input_ids"] + [EOS_ID] for a in rows["answer"]]
        ids = torch.tensor([p + a for p, a in zip(prompts, answers)])                          # (B, T): one length
        labels = torch.tensor([[-100] * len(p) + a for p, a in zip(prompts, answers)])         # (B, T)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()


class EvalAccuracy(TrainerCallback):
    """TRL logs each reward function's held-out mean as `eval_rewards/<name>/mean`; this names the
    exact-match one `eval_accuracy`, the metric a goal reads (as `heldout_acc`). It runs before
    SwarmCallback, which sees the same log dict."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "eval_rewards/exact/mean" in logs:
            logs["eval_accuracy"] = logs["eval_rewards/exact/mean"]


def parser() -> HfArgumentParser:
    p = HfArgumentParser((ScriptArguments, GRPOConfig))
    p.set_defaults(output_dir="runs/steer-grpo", max_steps=200, per_device_train_batch_size=32, num_generations=8,
                   max_completion_length=8, learning_rate=5e-4, logging_steps=1, save_strategy="steps", save_steps=50,
                   report_to="none", use_cpu=True, bf16=False, activation_checkpointing=False, use_vllm=False,
                   disable_tqdm=True, dataloader_num_workers=0, log_completions=False, reward_weights=[1.0, 1.0],
                   per_device_eval_batch_size=64, num_generations_eval=4, eval_strategy="steps", eval_steps=25)
    return p


def build(script: ScriptArguments, args: GRPOConfig) -> GRPOTrainer:
    tok = char_tokenizer()
    train = problems(script.length, script.train_size, seed=1)
    held = problems(script.length, script.eval_size, seed=2, exclude=frozenset(train["prompt"])) if script.eval_size else None
    model = tiny_policy(tok, script.d_model, script.n_layers, args.seed)
    if not args.resume_from_checkpoint:
        warm_up(model, tok, train, script.warmup_sft_steps, script.warmup_sft_lr, batch=64, seed=args.seed)
    trainer = GRPOTrainer(model=model, reward_funcs=[chars_right, exact], args=args, train_dataset=train,
                          eval_dataset=held, processing_class=tok, callbacks=[EvalAccuracy()])
    steer(trainer, script.run_dir)   # the one line a user adds
    return trainer


def main(argv: list[str] | None = None) -> int:
    script, args = parser().parse_args_into_dataclasses(args=argv)
    build(script, args).train(resume_from_checkpoint=args.resume_from_checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
