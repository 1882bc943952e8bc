"""ClusterOps: the operator that keeps the training job alive and on a worker that keeps up.

| finding                                   | intervention                                      | risk   |
|-------------------------------------------|---------------------------------------------------|--------|
| crashed job, stale heartbeat              | RESTART from the newest good checkpoint           | low    |
| out of memory (with a crash)              | RESTART with half the batch                       | medium |
| input-bound steps (a slow data pipeline)  | RESTART from the newest good checkpoint           | low    |
| throughput drop, corrupt checkpoint, ...  | none (reported)                                   |        |

A restart changes no field and moves no weight: what it changes is the worker process (on a
cluster, possibly the node) and the steps since the newest checkpoint, which are trained again.
"""
from __future__ import annotations

import math

from agents.base import Operator, OperatorContext
from agents.detection import to_float
from agents.domain import Diagnosis, Intervention, InterventionKind as K, Risk
from agents.evidence import Evidence


class ClusterOps(Operator):
    name = "cluster_ops"
    role = ("Cluster operations: keeps the training job alive. Watches the job status, the heartbeat and the "
            "throughput. When the job has crashed or hangs (heartbeat stale while RUNNING), restarts it from the "
            "newest good checkpoint. When the worker died of out-of-memory, the restart halves the batch size (the "
            "memory a step needs grows with it; the same config would die again); it edits nothing else. When the "
            "steps have come to wait on the data pipeline (a slow loader or disk: the worker's input, not the run), "
            "restarts the job from its newest checkpoint, and keeps that restart only if the steps are faster after "
            "it. A throughput drop without that, a corrupt checkpoint the trainer fell back from, a refused command, "
            "skipped steps and resumes are reported, not acted on.")
    tools = frozenset({K.RESTART})
    detectors = ("crashed_job", "stale_heartbeat", "out_of_memory", "input_bound", "throughput_drop",
                 "checkpoint_corrupt", "command_refused", "skipped_steps", "job_restarted")

    def builtin(self, ev: Evidence, ctx: OperatorContext) -> list[Intervention]:
        found = self.diagnose(ev, ctx)
        oom = next((d for d in found if d.name == "out_of_memory"), None)
        for d in found:
            if d.name == "crashed_job" and oom is not None:
                return [self._smaller_batch(oom, ctx)]
            if d.name in ("crashed_job", "stale_heartbeat"):
                what = "crashed" if d.name == "crashed_job" else "hangs"
                return [self.intervention(
                    K.RESTART, d, {}, risk=Risk.LOW,
                    rationale=f"The job {what} ({d.summary}); training makes no progress until it is restarted. "
                              "The trainer resumes from its newest checkpoint that verifies.",
                    expected_effect="heartbeat fresh and steps advancing again within a minute; metrics continue "
                                    "from the checkpoint's step",
                    backtest_skipped="restart after a crash or stall: nothing to compare against")]
        slow = next((d for d in found if d.name == "input_bound"), None)
        if slow is not None:
            before = to_float(slow.evidence.get("step_time_before"))
            return [self.intervention(
                K.RESTART, slow, {}, risk=Risk.LOW,
                rationale=f"{slow.summary}. The model's share of each step did not grow, the wait for data did: the "
                          "worker's input (its loader or disk) slowed, not the run. A new worker process (on a "
                          "cluster, wherever Ray places it) resumes from the newest checkpoint; the steps since it "
                          "are trained again.",
                expected_effect="steps back near "
                                + (f"{before:.3g} s" if before is not None and math.isfinite(before) else "their earlier time")
                                + " within the judged window; kept only if they are faster than before the restart",
                backtest_skipped="a restart changes no field and no weight: arms forked from the same checkpoint "
                                 "would train the same steps")]
        return []

    def _smaller_batch(self, oom: Diagnosis, ctx: OperatorContext) -> Intervention:
        """Restart with half the batch: the activations of a step grow with its batch, so half the
        batch needs about half the memory; a second OOM halves it again."""
        v = to_float(ctx.get("recipe.batch_size"))
        bs = int(v) if v is not None and math.isfinite(v) else 0
        changes = {"recipe.batch_size": max(1, bs // 2)} if bs > 1 else {}
        return self.intervention(
            K.RESTART, oom, changes, risk=Risk.MEDIUM if changes else Risk.LOW,
            rationale=f"{oom.summary}. The worker died allocating memory; a restart with the same config meets the "
                      f"same allocation at the same step, so "
                      + (f"it restarts with recipe.batch_size {bs} → {bs // 2} (the memory a step needs grows with "
                         "its batch)." if changes else "with a batch of one there is nothing to halve: a plain restart."),
            expected_effect="the job trains past the step it died at, with steps about half as long; held-out "
                            "accuracy still rising (each step sees half as many examples)",
            backtest_skipped="the job cannot train at the current batch size: no control arm runs")
