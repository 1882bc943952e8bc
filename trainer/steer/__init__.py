"""Steering SDK: make a user's own Hugging Face / TRL training script a run the swarm reads and
steers (`docs/steering.md`).

    from trainer.steer import steer
    steer(trainer, run_dir="runs/my-run")    # before trainer.train()

`relaunch` runs the script as a child process and launches it again after a restart-required
change or a crash (`python -m trainer.steer.relaunch --run-dir RUN -- python train.py …`).
`fork` runs it again from one of its checkpoints in a folder of its own, for a fixed number of
steps (the swarm's backtest arms).

`settings` (declared settings and the pure `check_change`) imports neither torch nor
transformers; `callback` needs transformers.
"""
from trainer.steer.settings import Setting, check_change, declared_settings, read_declared

__all__ = ["Setting", "check_change", "declared_settings", "read_declared", "SwarmCallback", "steer"]


def __getattr__(name: str):
    if name in ("SwarmCallback", "steer"):
        from trainer.steer import callback

        return getattr(callback, name)
    raise AttributeError(name)
