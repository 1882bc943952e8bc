"""The fused CPU RMSNorm (kernels/cpu.py): built with the machine's C compiler on first use, equal
to the torch expression forward and backward, and a clean fallback when it cannot be built."""
from __future__ import annotations

import shutil

import pytest
import torch

from kernels import cpu, reference

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty kernel cache and a cleared loader, restored afterwards."""
    monkeypatch.setenv("SWARMLAB_KERNEL_CACHE", str(tmp_path / "kcache"))
    cpu._load.cache_clear()
    yield tmp_path / "kcache"
    cpu._load.cache_clear()


@needs_cc
@pytest.mark.parametrize("shape", [(3, 5, 16), (7, 128), (2, 3, 4, 33), (1, 1)])
def test_matches_the_torch_expression_forward_and_backward(fresh, shape):
    ok, reason = cpu.available()
    assert ok, reason
    assert list(fresh.glob("rmsnorm-*.so")), "built into the cache directory"
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(*shape, generator=g) * 3
    w0 = 1 + 0.1 * torch.randn(shape[-1], generator=g)
    up = torch.randn(*shape, generator=g)
    grads = []
    for f in (reference.rms_norm, cpu.rms_norm):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        y = f(x, w, 1e-6)
        y.backward(up)
        grads.append((y.detach(), x.grad, w.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


@needs_cc
def test_non_contiguous_input_and_double_rejected(fresh):
    x = torch.randn(16, 8).t()          # (8, 16), not contiguous
    w = torch.rand(16)
    torch.testing.assert_close(cpu.rms_norm(x, w), reference.rms_norm(x, w), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="float32"):
        cpu.rms_norm(x.double(), w.double())


def test_no_compiler_is_a_reason_not_a_crash(fresh, monkeypatch):
    monkeypatch.setenv("SWARMLAB_CC", "no-such-cc-xyz")
    ok, reason = cpu.available()
    assert not ok and "no-such-cc-xyz" in reason
    with pytest.raises(RuntimeError, match="unavailable"):
        cpu.rms_norm(torch.randn(2, 4), torch.ones(4))


def test_a_failing_build_is_a_reason_not_a_crash(fresh, monkeypatch):
    monkeypatch.setenv("SWARMLAB_CC", "false")     # exits 1 without output
    ok, reason = cpu.available()
    assert not ok and "building the CPU RMSNorm kernel failed" in reason
    assert not list(fresh.glob("rmsnorm-*.so"))


@needs_cc
def test_the_trainer_uses_it_on_cpu_and_learns_the_same(fresh, make_cfg, monkeypatch):
    """kernels: auto routes the built-in model's RMSNorm through the C kernel (named in the start
    event); its losses over a few steps equal those of kernels: torch to float32 rounding; with no
    compiler the run falls back to torch ops and says why."""
    from trainer.config import RunConfig
    from trainer.loop import Trainer
    from trainer.runlog import read_jsonl

    losses, backends = {}, {}
    for k in ("auto", "torch"):
        cfg = RunConfig.parse(make_cfg(name=f"k-{k}", model={"kernels": k}, recipe={"steps": 4, "eval_interval": 0},
                                       samples_per_step=0))
        tr = Trainer(cfg)
        backends[k] = {m.backend for m in tr.policy.model.modules() if type(m).__name__ == "RMSNorm"}
        tr.run()
        losses[k] = [r["loss"] for r in read_jsonl(cfg.run_dir / "metrics.jsonl") if "loss" in r]
        start = next(r for r in read_jsonl(cfg.run_dir / "events.jsonl") if r.get("kind") == "start" or r.get("event") == "start")
        if k == "auto":
            assert "fused C kernel" in str(start), start
    assert backends == {"auto": {"cpu"}, "torch": {"torch"}}
    assert losses["auto"] == pytest.approx(losses["torch"], rel=1e-5)
    monkeypatch.setenv("SWARMLAB_CC", "no-such-cc-xyz")
    cpu._load.cache_clear()
    monkeypatch.setenv("SWARMLAB_KERNEL_CACHE", str(fresh / "empty"))
    tr = Trainer(RunConfig.parse(make_cfg(name="k-none", recipe={"steps": 1})))
    assert {m.backend for m in tr.policy.model.modules() if type(m).__name__ == "RMSNorm"} == {"torch"}
    assert "no C compiler" in tr._kernel_reason
    tr.close()


def test_an_unwritable_cache_is_a_reason_not_a_crash(fresh, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SWARMLAB_KERNEL_CACHE", str(blocker / "kernels"))
    ok, reason = cpu.available()
    assert not ok and "unusable" in reason and "torch ops" in reason
