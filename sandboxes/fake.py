"""A scripted sandbox for tests of code that uses one (nothing runs).

Give it a queue of outcomes: an `ExecResult` is returned as is, a callable is called with the
request, an exception is raised inside the backend (so `execute` turns it into an ERROR result,
as a real backend failure would be). Every request is recorded in `calls`.

    sb = FakeSandbox([ok_result("hello\\n"), RuntimeError("engine went away")])
"""
from __future__ import annotations

import collections
import threading
from typing import Callable, Iterable, Union

from sandboxes.base import ExecRequest, ExecResult, Isolation, Limits, ResourceUsage, Sandbox, StopReason

Outcome = Union[ExecResult, BaseException, Callable[[ExecRequest], ExecResult]]


def ok_result(stdout: str | bytes = b"", exit_code: int = 0, **kw) -> ExecResult:
    out = stdout.encode() if isinstance(stdout, str) else stdout
    return ExecResult(StopReason.EXIT, exit_code, stdout=out, usage=ResourceUsage(0.0), isolation=Isolation.FAKE, **kw)


class FakeSandbox(Sandbox):
    isolation = Isolation.FAKE

    def __init__(self, outcomes: Iterable[Outcome] = (), limits: Limits | None = None) -> None:
        super().__init__(limits)
        self.outcomes = collections.deque(outcomes)
        self.calls: list[ExecRequest] = []
        self._lock = threading.Lock()

    def _execute(self, request: ExecRequest, limits: Limits) -> ExecResult:
        with self._lock:
            self.calls.append(request)
            if not self.outcomes:
                raise AssertionError(f"FakeSandbox has no scripted outcome left for {request.argv!r}")
            outcome = self.outcomes.popleft()
        if isinstance(outcome, BaseException):
            raise outcome
        if callable(outcome) and not isinstance(outcome, ExecResult):
            return outcome(request)
        return outcome
