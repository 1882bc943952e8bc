"""Job entrypoint: `python -m trainer.entry CONFIG.yaml` (what a Ray job runs).

With `num_workers == 1` the loop runs in this process; with more it fans out over Ray Train
workers. The summary is printed as one JSON line at the end."""
from __future__ import annotations

import json
import sys

from trainer.config import ConfigError, RunConfig


def read_config(argv: list[str], module: str = "trainer.entry") -> RunConfig | None:
    """The run config a job entrypoint's one argument names; None when there is none, after one
    line on stderr saying why (the caller exits 2)."""
    if len(argv) != 1:
        print(f"usage: python -m {module} CONFIG.yaml", file=sys.stderr)
        return None
    try:
        return RunConfig.from_yaml(argv[0])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


def main(argv: list[str]) -> int:
    cfg = read_config(argv)
    if cfg is None:
        return 2
    if cfg.num_workers > 1:
        import ray

        from trainer.launch import run_ray_train

        ray.init(address="auto", _node_ip_address="127.0.0.1", log_to_driver=False)
        summary = run_ray_train(cfg)
    else:
        from trainer.loop import Trainer

        summary = Trainer(cfg).run()
    print(json.dumps(summary))
    return 0 if summary.get("status", "completed") in ("completed", "stopped_by_command", "target_reached") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
