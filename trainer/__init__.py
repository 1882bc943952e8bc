"""The trainer: one loop for SFT, GRPO and distill (`trainer/loop.py`, algorithms in
`trainer/algorithms/`) over a built-in transformer or a local Hugging Face causal LM, on the tasks
in `trainer/tasks/`. It writes the run files the swarm reads (metrics, samples, events, heartbeat,
checkpoints; `trainer/runlog.py`) and takes commands between steps (`trainer/control.py`).

    swarm train run.yaml                   # in this process
    python -m trainer.entry run.yaml       # what a Ray job runs (trainer/launch.py submits it)

Its configuration is `trainer/config.py` (docs/configuration.md lists every field).
"""
