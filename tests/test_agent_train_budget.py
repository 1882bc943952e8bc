"""A caller's budget inside the agent trainer's stages: `AgentTrainer.distill(stop=...)` asks
`stop` before each distillation step and ends the stage when it answers True (the co-evolution
benchmark, benchmarks/coevolution.py, stops each arm when its worker-CPU budget is spent). Real
tiny built-in model, untrained: its teacher rollouts verify nothing, so without a stop the stage
ends by its own rule after 3 steps without a row."""
from __future__ import annotations

import torch

from trainer.agent_train import AgentTrainConfig, AgentTrainer
from trainer.config import ModelConfig


def trainer(tmp_path) -> AgentTrainer:
    cfg = AgentTrainConfig.parse({
        "env": "lookup", "out_dir": str(tmp_path), "name": "budget", "threads": 1, "eval_size": 4,
        "system_prompt": "Tools: get(key).", "max_new_tokens": 32, "max_turns": 4, "sft": {"steps": 0},
        "model": ModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=256, learned_positions=True).model_dump(),
        "critic": {"enabled": True, "distill_steps": 5, "distill_batch": 2}})
    return AgentTrainer(cfg, printer=None)


def test_distillation_asks_stop_before_each_step_and_ends_when_it_answers_true(tmp_path):
    threads = torch.get_num_threads()
    try:
        asked: list[int] = []

        def stop() -> bool:
            asked.append(1)
            return len(asked) > 2   # a budget that allows two steps

        out = trainer(tmp_path / "a").distill(stop=stop)
        assert len(asked) == 3 and out["distill_episodes"] == 2 * 2
        # a stop that never answers True changes nothing: the stage's own rule ends it (3 steps, no row)
        never = trainer(tmp_path / "b").distill(stop=lambda: False)
        default = trainer(tmp_path / "c").distill()
        assert never == default and default["distill_episodes"] == 3 * 2 and default["distill_rows"] == 0
    finally:
        torch.set_num_threads(threads)
