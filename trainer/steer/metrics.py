"""Hugging Face / TRL log names → the run format's names (what `agents/` detectors and the swarm read).

Training logs: `learning_rate` → `lr`, TRL's `reward` → `reward_mean`, `completions/mean_length` →
`response_len`, `completions/clipped_ratio` (completions cut at the length limit) →
`truncation_rate`; `loss`, `grad_norm`, `reward_std`, `kl`, `entropy`, `epoch` keep their names, and
so does any other key. Evaluation logs (`eval_*`): `eval_accuracy` → `heldout_acc`, TRL's
`eval_completions/clipped_ratio` → `heldout_truncated` (held-out answers cut off), the timings
(`eval_runtime`, …) keep their names, every other `eval_X` becomes `heldout_X` — a row with a
`heldout*` key is an eval row to every reader (`agents.evidence.is_eval_row`). A user's own names
(`SwarmCallback(metric_names=…)`) win over these.
"""
from __future__ import annotations

from typing import Any, Mapping

NAMES: dict[str, str] = {
    "learning_rate": "lr",
    "reward": "reward_mean",
    "completions/mean_length": "response_len",
    "completions/clipped_ratio": "truncation_rate",
    "eval_accuracy": "heldout_acc",
    "eval_completions/clipped_ratio": "heldout_truncated",
}
EVAL_TIMINGS = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "eval_model_preparation_time")
# the train-end summary the Trainer logs once (recorded with the end event, not as a metrics row)
SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss")


def is_summary(logs: Mapping[str, Any]) -> bool:
    return "train_runtime" in logs


def run_name(key: str, names: Mapping[str, str] | None = None) -> str:
    if names and key in names:
        return names[key]
    if key in NAMES:
        return NAMES[key]
    if key.startswith("eval_") and key not in EVAL_TIMINGS:
        return "heldout_" + key[len("eval_"):]
    return key


def run_metrics(logs: Mapping[str, Any], names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The logged values under the run format's names (scalars only; a table or a list is dropped)."""
    out: dict[str, Any] = {}
    for k, v in logs.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            continue
        out[run_name(k, names)] = v
    return out
