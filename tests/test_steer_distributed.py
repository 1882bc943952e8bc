"""SwarmCallback under torch.distributed: two CPU ranks (torchrun, gloo) train one tiny GPT-2.
Only rank 0 reads the inbox; the command reaches rank 1 by broadcast, both ranks apply it at the
same step end, and it is acknowledged once. About 15 s (two processes importing transformers)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (not in the test extras)")

from trainer.runlog import read_jsonl  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = '''import json, os, pathlib, sys
import torch
sys.path.insert(0, os.environ["REPO"])
torch.set_num_threads(1)
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from trainer.control import send_command
from trainer.steer import steer

out, run = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])

class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randint(0, 64, (256, 16), generator=torch.Generator().manual_seed(0))
    def __len__(self): return len(self.x)
    def __getitem__(self, i): return {"input_ids": self.x[i], "labels": self.x[i]}

class Send(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if state.global_step == 3 and state.is_world_process_zero:
            send_command(run, "set_fields", id="lr", fields={"learning_rate": 5e-3, "max_grad_norm": 0.5})

class Probe(TrainerCallback):
    def __init__(self): self.rows = {}
    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kw):
        self.rows[state.global_step] = [optimizer.param_groups[0]["lr"], args.max_grad_norm]

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=1))
args = TrainingArguments(output_dir=str(out), max_steps=8, per_device_train_batch_size=2, learning_rate=1e-3,
                         lr_scheduler_type="linear", logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                         disable_tqdm=True, dataloader_num_workers=0)
probe = Probe()
tr = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Send(), probe])
steer(tr, run)
tr.train()
rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else -1
(out / f"probe{rank}.json").write_text(json.dumps({"world": torch.distributed.get_world_size() if rank >= 0 else 1, "rows": probe.rows}))
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rank_zero_reads_and_every_rank_applies(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out, run = tmp_path / "out", tmp_path / "run"
    env = {**os.environ, "REPO": REPO, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                        "--master_port", str(free_port()), str(script), str(out), str(run)],
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    ranks = [json.loads((out / f"probe{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    # linear schedule over 8 updates; the command lands at the end of update 3 (index 2)
    want = [x for i in range(8) for x in ((1e-3 if i < 3 else 5e-3) * (1 - i / 8), 1.0 if i < 3 else 0.5)]
    for r in ranks:
        assert sorted(r["rows"], key=int) == [str(i) for i in range(8)]
        assert [x for i in range(8) for x in r["rows"][str(i)]] == pytest.approx(want), r["rows"]
    acks = read_jsonl(run / "command_log.jsonl")
    assert [(a["id"], a["status"], a["step"]) for a in acks] == [("lr", "applied", 3)]
