"""Many episodes at once, with the policy's calls batched: `run_batched`.

`trainer.agent_rollout.run_episode` makes one policy call at a time; a GRPO step runs P·G
episodes, and on a small model one call of one row costs about what one call of 32 rows costs
(each decode step is a handful of small ops). So each episode runs unchanged in its own thread,
and its policy is a slot of one `BatchedGenerator`: a slot's `generate` waits until every episode
still running is waiting too, then one of them generates for all of them in one
`Policy.generate` call (prompts of one distinct text are prefilled once: the G episodes of a
group share their first prompt). Requests are served in episode order, so a run is as
reproducible as the sequential one (the same seed gives the same trajectories), though not the
same trajectories as the sequential rollout (the random stream is consumed in another order).

    trajs = run_batched(policy, env, examples, harness, greedy=False, generator=torch.Generator().manual_seed(0))

The episode logic is untouched: only the policy calls are gathered.
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from harness.agent import AgentHarness
from trainer.agent_rollout import Trajectory, cut_at_stop, run_episode
from trainer.envs.base import AgentEnv
from trainer.tasks.base import Example


class _Slot:
    """One episode's view of the batched generator (a `trainer.agent_rollout.Generator`)."""

    def __init__(self, owner: "BatchedGenerator", index: int) -> None:
        self.owner, self.index, self.tok, self.max_len = owner, index, owner.tok, owner.max_len

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float, stop: list[str]) -> list[int]:
        return self.owner.request(self.index, prompt_ids, max_new_tokens, temperature, stop)


class BatchedGenerator:
    def __init__(self, policy: Any, top_p: float = 1.0, generator: torch.Generator | None = None) -> None:
        self.policy, self.tok, self.top_p, self.rng = policy, policy.tok, top_p, generator
        self.max_len = policy._max_len()
        self._cv = threading.Condition()
        self._active = 0
        self._pending: dict[int, tuple[list[int], int, float, tuple[str, ...]]] = {}
        self._results: dict[int, list[int] | BaseException] = {}
        self.calls = 0        # batched policy calls made
        self.rows = 0         # rows generated in them

    def request(self, index: int, prompt: list[int], max_new: int, temperature: float, stop: list[str]) -> list[int]:
        with self._cv:
            self._pending[index] = (list(prompt), max_new, temperature, tuple(stop))
            self._maybe_flush()
            while index not in self._results:
                self._cv.wait()
            out = self._results.pop(index)
        if isinstance(out, BaseException):
            raise out
        return out

    def _done(self) -> None:
        with self._cv:
            self._active -= 1
            self._maybe_flush()

    def _maybe_flush(self) -> None:
        """With the lock held: when every running episode waits, serve them all."""
        if not self._pending or len(self._pending) < self._active:
            return
        pending, self._pending = self._pending, {}
        by_kind: dict[tuple[int, float, tuple[str, ...]], list[int]] = {}
        for i in sorted(pending):
            by_kind.setdefault(pending[i][1:], []).append(i)
        for (max_new, temperature, stop), idx in by_kind.items():
            try:
                singles = {ids[0] for ids in (self.tok.encode(s) for s in stop) if len(ids) == 1}
                comps, _ = self.policy.generate([pending[i][0] for i in idx], max_new, temperature=temperature,
                                                top_p=self.top_p, stop_ids=singles, generator=self.rng)
                self.calls += 1
                self.rows += len(idx)
                for i, c in zip(idx, comps):
                    self._results[i] = cut_at_stop(self.tok, c, list(stop))[0]
            except Exception as e:  # the policy failed: every episode of the batch raises it
                for i in idx:
                    self._results[i] = e
        self._cv.notify_all()

    def run(self, env: AgentEnv, examples: list[Example], harness: AgentHarness, greedy: bool = False
            ) -> list[Trajectory]:
        """`run_episode` of every example, concurrently, in example order."""
        out: list[Trajectory | None] = [None] * len(examples)
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                out[i] = run_episode(_Slot(self, i), env, examples[i], harness, greedy=greedy)
            except BaseException as e:  # re-raised in the caller's thread below
                errors.append(e)
            finally:
                self._done()

        with self._cv:
            self._active = len(examples)
        threads = [threading.Thread(target=work, args=(i,), daemon=True, name=f"episode-{i}")
                   for i in range(len(examples))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        assert all(t is not None for t in out), "every episode ended"
        return out  # type: ignore[return-value]


def run_batched(policy: Any, env: AgentEnv, examples: list[Example], harness: AgentHarness, greedy: bool = False,
                generator: torch.Generator | None = None, top_p: float = 1.0) -> list[Trajectory]:
    """Episodes of `examples` under `harness` with the `trainer.policy.Policy` `policy`, its calls batched."""
    return BatchedGenerator(policy, top_p, generator).run(env, examples, harness, greedy=greedy)
