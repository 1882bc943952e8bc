"""Shared fixtures for the trainer, CLI and Ray-job tests.

Every test in those modules runs with its working directory in its own temp dir (so a relative
`out_dir` can never land in the repository), with torch on one thread (the machine is shared).
`make_cfg` builds a tiny, fast `RunConfig` — a 1-layer 32-wide built-in model on digit reversal —
with nested overrides; `warm_state` is that model after a short SFT run (it answers most
reversal questions), for the algorithms that need a policy with some reward signal; and
`tiny_hf_dir` saves a random-initialised Hugging Face Llama and a character-level tokenizer built
with the `tokenizers` library, so the HF path runs with nothing downloaded.
"""
from __future__ import annotations

import copy
import os
import pathlib
import string
import subprocess
import tempfile
from typing import Any

import psutil
import pytest
import torch

# one CPU-kernel cache for the whole session (tests that give processes their own HOME would
# otherwise rebuild it in every trainer process); a test may still point it elsewhere
os.environ.setdefault("SWARMLAB_KERNEL_CACHE", tempfile.mkdtemp(prefix="swarmlab-kernels-"))

# Modules whose tests are isolated here; the other test modules keep their own conventions.
_OWN = ("test_trainer_", "test_cli", "test_ray_job")

BASE: dict[str, Any] = {
    "name": "run",
    "seed": 0,
    "threads": 1,
    "samples_per_step": 4,
    "task": {"name": "reverse"},
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32},
    "harness": {
        "curriculum": {"start": 3},
        "answer": {"reverse_digits": True},
        "sampling": {"max_new_tokens": 6},
    },
    "recipe": {
        "algorithm": "sft", "lr": 1e-2, "steps": 6, "batch_size": 8, "group_size": 4,
        "warmup_steps": 2, "eval_interval": 0, "eval_size": 16,
    },
    "checkpoint": {"interval": 0, "keep_last": 3},
}

# A recipe with which the BASE model learns 3-digit reversal in about a second (held-out accuracy
# ≥ 0.9 by step 50 for seeds 0–2, measured).
LEARN: dict[str, Any] = {"lr": 3e-2, "steps": 80, "batch_size": 32, "warmup_steps": 5}


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in ("set", "options", "fields"):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


@pytest.fixture(autouse=True)
def _isolate(request, tmp_path, monkeypatch):
    if not request.module.__name__.rsplit(".", 1)[-1].startswith(_OWN):
        yield
        return
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def make_cfg(tmp_path):
    """`make_cfg(**nested_overrides)` → dict for `RunConfig.parse`, writing under tmp_path/runs."""

    def make(**over: Any) -> dict[str, Any]:
        return deep_merge({**BASE, "out_dir": str(tmp_path / "runs")}, over)

    return make


@pytest.fixture
def learn_recipe() -> dict[str, Any]:
    return dict(LEARN)


@pytest.fixture(scope="session")
def warm_state(tmp_path_factory) -> dict[str, torch.Tensor]:
    """Weights of the BASE model after the LEARN recipe on 3-digit reversal (held-out accuracy near
    1 with greedy decoding; sampling at temperature 1 still varies within a group)."""
    from trainer.config import RunConfig
    from trainer.loop import Trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("warm")
    cfg = RunConfig.parse(deep_merge({**BASE, "out_dir": str(out)},
                                     {"name": "warm", "recipe": LEARN,
                                      "samples_per_step": 0}))
    tr = Trainer(cfg)
    summary = tr.run()
    torch.set_num_threads(threads)
    assert summary["heldout_acc"] >= 0.8, f"warm start did not learn: {summary}"
    return {k: v.clone() for k, v in tr.policy.model.state_dict().items()}


CHARS = string.digits + "+-*=:rs\n "


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory) -> pathlib.Path:
    """A random-initialised 1-layer Llama (hidden 32) and a char-level fast tokenizer, saved locally."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    for c in CHARS:
        vocab[c] = len(vocab)
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tk.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>", padding_side="left")
    torch.manual_seed(0)
    mcfg = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    d = tmp_path_factory.mktemp("tiny_hf")
    LlamaForCausalLM(mcfg).save_pretrained(d)
    fast.save_pretrained(d)
    return d


@pytest.fixture
def clean_git_home(tmp_path, monkeypatch):
    """Git (here and in processes started by the test) sees an empty HOME and no system config:
    no identity, hooks or signing of the machine leak in; the workspace sets its own identity.
    No shared skill library from the environment either."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    monkeypatch.delenv("SWARMLAB_LIBRARY", raising=False)
    for k in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_DIR", "GIT_WORK_TREE"):
        monkeypatch.delenv(k, raising=False)


def trainer_procs(ws: pathlib.Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if "trainer.entry" in cmd and str(ws) in cmd:
            out.append(p)
    return out


@pytest.fixture
def reap(tmp_path):
    """Controllers the test started, killed at the end, and every trainer process (they run in
    their own sessions, so they outlive a SIGKILLed controller) started under tmp_path."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for p in trainer_procs(tmp_path):
        try:
            p.kill()
        except psutil.Error:
            pass


@pytest.fixture
def one_thread():
    """torch on one thread for the test, the machine's setting given back after it (use with
    `pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
