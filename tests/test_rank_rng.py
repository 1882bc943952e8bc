"""A resumed data-parallel run continues every rank's own random streams (trainer/loop.py
`ranks_rng`: gathered from every rank into each checkpoint, restored by rank): two gloo ranks on
loopback sampling GRPO groups, one run straight to step 4 and one stopped at step 2 and resumed,
end with the same sampling generator and the same weights on each rank. A checkpoint that holds
one process's streams only (a single-process run forked into a data-parallel one) still gives
every other rank a stream of its own.

The workers run this file as a script: `python tests/test_rank_rng.py RANK WORLD PORT SPEC OUT`.
"""
from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import torch

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script by the workers
    sys.path.insert(0, str(REPO))

import gloo_ranks  # noqa: E402
from test_rank_resume import weights_digest  # noqa: E402
from trainer.config import RunConfig  # noqa: E402
from trainer.distributed import Dist, init_gloo  # noqa: E402

CFG = {"task": {"name": "addition"}, "threads": 1, "samples_per_step": 0,
       "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 48},
       "harness": {"curriculum": {"start": 2}, "sampling": {"max_new_tokens": 6, "temperature": 1.0}},
       "recipe": {"algorithm": "grpo", "batch_size": 4, "group_size": 4, "lr": 1e-2, "steps": 4, "warmup_steps": 0,
                  "schedule": "constant", "eval_interval": 0, "eval_size": 4},
       "checkpoint": {"interval": 2, "keep_last": 4}}


def _digest(tr: Any) -> dict[str, str]:
    import hashlib

    return {"gen": hashlib.sha256(bytes(tr.gen.get_state().numpy())).hexdigest(),
            "weights": weights_digest(tr.policy.model.state_dict()), "step": tr.step}


def _worker(rank: int, world: int, port: int, spec: str, out: str) -> None:
    from trainer.loop import Trainer

    torch.set_num_threads(1)
    init_gloo(rank, world, port, timeout_s=180)
    root = pathlib.Path(json.loads(pathlib.Path(spec).read_text())["root"])
    dist = Dist()
    res = {}
    straight = Trainer(RunConfig.model_validate({**CFG, "name": "straight", "out_dir": str(root)}), dist=dist)
    straight.run()
    res["straight"] = _digest(straight)
    cut = RunConfig.model_validate({**CFG, "name": "cut", "out_dir": str(root)})
    Trainer(cut, dist=dist).run(until=2)     # ends at step 2, as if killed after its checkpoint there
    resumed = Trainer(cut, dist=dist)
    resumed.run()
    res["resumed"] = _digest(resumed)
    pathlib.Path(out, f"rank{rank}.json").write_text(json.dumps(res))
    gloo_ranks.end_rank()


def test_a_resumed_data_parallel_run_continues_every_ranks_own_streams(tmp_path):
    (tmp_path / "spec.json").write_text(json.dumps({"root": str(tmp_path / "runs")}))
    gloo_ranks.wait(gloo_ranks.start(__file__, [str(tmp_path / "spec.json"), str(tmp_path)]), timeout=300)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for r in (r0, r1):
        assert r["straight"]["step"] == r["resumed"]["step"] == 4
        assert r["resumed"] == r["straight"], r
    assert r0["straight"]["gen"] != r1["straight"]["gen"]   # each rank samples its own completions


def test_a_checkpoint_with_one_process_streams_gives_each_rank_its_own(make_cfg, tmp_path):
    from trainer.loop import Trainer

    class TwoRanks(Dist):
        def __init__(self, rank: int) -> None:
            self.enabled, self.rank, self.world = True, rank, 2

    torch.set_num_threads(1)
    cfg = RunConfig.parse(make_cfg(name="one", out_dir=str(tmp_path), recipe={"steps": 2}, checkpoint={"interval": 2}))
    one = Trainer(cfg)
    one.run()
    st = torch.load(next((tmp_path / "one" / "checkpoints").glob("step_*.pt")), weights_only=False)
    assert "ranks_rng" not in st
    gens = []
    for rank in (0, 1):
        tr = Trainer(cfg, dist=TwoRanks(rank))
        tr.load_state(st)
        gens.append(bytes(tr.gen.get_state().numpy()))
        tr.close()
    assert gens[0] == bytes(one.gen.get_state().numpy()) and gens[1] != gens[0]


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
