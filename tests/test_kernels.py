"""Triton kernels against their pure-torch references, on CPU through Triton's interpreter.

Every kernel (token log-prob, fused linear log-prob, fused linear GRPO loss, RMSNorm) is compared
with `kernels.reference`, forward and every gradient, over a table of shapes (a single token, a
vocabulary that is not a multiple of the block, several blocks, leading batch dims, padding masks)
and dtypes float32 / float16 / bfloat16 (the kernels only load and store half precision and do
their arithmetic in float32, which the interpreter supports; bf16 *arithmetic* it does not).

Triton reads TRITON_INTERPRET when `@triton.jit` decorates a function: for Triton's own library
(`tl.max`, `tl.sum` are jit functions) that is the process's first `import triton`, for ours the
import of `kernels.ops`. So this module sets the variable before importing anything that may
import triton, and restores it afterwards (an autouse fixture sets it again per test, since
`select_backend("triton", cpu)` checks it). If another test module imported triton first, the
kernel tests here skip and `test_kernels_in_fresh_process` runs this file in a new process.

On a GPU, `KERNELS_TEST_DEVICE=cuda` runs the same tests on the compiled kernels.

Run: .venv/bin/python -m pytest tests/test_kernels.py -q   (about 30-40 s on 2 cores)
     KERNELS_TEST_DEVICE=cuda .venv/bin/python -m pytest tests/test_kernels.py -q   (on a GPU)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEVICE = os.environ.get("KERNELS_TEST_DEVICE", "cpu")
_PREVIOUS = os.environ.get("TRITON_INTERPRET")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # before this process imports triton, if it has not yet

import pytest  # noqa: E402
import torch  # noqa: E402

import kernels  # noqa: E402
from kernels import reference  # noqa: E402
from kernels.modules import FusedLinearGRPOLoss, RMSNorm  # noqa: E402
from kernels.ops import fused_linear as fused_op  # noqa: E402  (decorates the kernels)
from kernels.ops import logprob as logprob_op  # noqa: E402

# In-process only when Triton's own jit library and our kernels were decorated for the
# interpreter; otherwise (another test module imported triton first) a fresh process runs them.
WHY_NOT_HERE = kernels._interpreter_mismatch() if DEVICE == "cpu" else None
if _PREVIOUS is None:
    os.environ.pop("TRITON_INTERPRET", None)
else:
    os.environ["TRITON_INTERPRET"] = _PREVIOUS
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _setup(request, monkeypatch):
    if WHY_NOT_HERE is not None and request.node.name != "test_kernels_in_fresh_process":
        pytest.skip(f"{WHY_NOT_HERE}: run in a fresh process by test_kernels_in_fresh_process")
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    torch.set_default_device(DEVICE)
    yield
    torch.set_default_device("cpu")


@pytest.mark.skipif(WHY_NOT_HERE is None, reason="the kernels run in this process")
def test_kernels_in_fresh_process():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


# Tolerances per dtype for (outputs, gradients). float32 is arithmetic noise; half precision is
# one rounding of the stored result (the kernels and the references both compute in float32).
TOL = {
    torch.float32: dict(atol=2e-5, rtol=1e-4),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
DTYPES = list(TOL)


def close(actual, expected, dtype, what):
    torch.testing.assert_close(actual.float(), expected.float(), **TOL[dtype], msg=lambda m: f"{what}: {m}")


# ---------------------------------------------------------------------------------------- dispatch

@pytest.mark.skipif(DEVICE != "cpu", reason="checks the CPU interpreter rules")
def test_select_backend(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert kernels.select_backend("torch", cpu)[0] == "torch"
    assert kernels.select_backend("torch", cuda)[0] == "torch"
    assert kernels.select_backend("auto", cpu)[0] == "torch"
    assert kernels.select_backend("auto", cuda)[0] == "triton"
    backend, reason = kernels.select_backend("triton", "cpu")
    assert backend == "triton" and "interpreter" in reason
    with pytest.raises(ValueError, match="backend must be one of"):
        kernels.select_backend("cuda", cpu)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert kernels.select_backend("auto", cpu)[0] == "torch"
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        kernels.select_backend("triton", cpu)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        kernels.token_logprobs(torch.randn(2, 5), torch.zeros(2, dtype=torch.long), backend="triton")


def test_input_validation():
    with pytest.raises(ValueError, match="targets shape"):
        kernels.token_logprobs(torch.randn(2, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        kernels.token_logprobs(torch.randn(2, 5), torch.zeros(2))
    h, w, t = torch.randn(4, 8), torch.randn(11, 8), torch.zeros(4, dtype=torch.long)
    z = torch.zeros(4)
    with pytest.raises(ValueError, match="needs ref_logp"):
        kernels.fused_linear_grpo_loss(h, w, t, z, None, z, z + 1, 0.2, 0.1)
    with pytest.raises(ValueError, match="mask shape"):
        kernels.fused_linear_grpo_loss(h, w, t, z, None, z, torch.ones(5), 0.2, 0.0)
    with pytest.raises(ValueError, match="clip_eps"):
        kernels.fused_linear_grpo_loss(h, w, t, z, None, z, z + 1, 1.5, 0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        kernels.fused_linear_logprobs(h, w, t, backend="triton", chunk_size=0)


# ----------------------------------------------------------------------------- token log-probs

# (logits shape, vocab block): None is the production block (one block up to 32k columns).
LOGPROB_CASES = [
    ((1, 7), None),            # a single token, tiny vocabulary
    ((1, 300), 64),            # single token, vocab not a multiple of the block
    ((3, 5, 423), 64),         # batch dims, 7 blocks, ragged last block
    ((17, 1000), 128),
    ((2, 3, 2048), None),      # vocab exactly one block
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,block", LOGPROB_CASES, ids=str)
def test_token_logprobs_matches_reference(shape, block, dtype):
    logits = (torch.randn(shape) * 4).to(dtype).requires_grad_()
    targets = torch.randint(0, shape[-1], shape[:-1])
    g_logp, g_ent = torch.randn(shape[:-1]), torch.randn(shape[:-1])

    logp, ent = logprob_op.token_logprobs(logits, targets, block)
    (logp * g_logp + ent * g_ent).sum().backward()
    ref_logits = logits.detach().clone().requires_grad_()
    ref_logp, ref_ent = reference.token_logprobs(ref_logits, targets)
    (ref_logp * g_logp + ref_ent * g_ent).sum().backward()

    assert logp.dtype == ent.dtype == torch.float32 and logp.shape == targets.shape
    assert logits.grad.dtype == dtype
    close(logp, ref_logp, torch.float32, "logp")
    close(ent, ref_ent, torch.float32, "entropy")
    close(logits.grad, ref_logits.grad, dtype, "dlogits")


def test_token_logprobs_one_output_and_strided_input():
    """Only logp used (entropy gets no gradient); logits[:, :-1] read in place, not copied."""
    full = torch.randn(2, 6, 300)
    base = full.clone().requires_grad_()
    sliced = base[:, :-1]  # non-contiguous (B, T-1, V) view
    assert not sliced.is_contiguous()
    targets = torch.randint(0, 300, (2, 5))
    logp, _ = kernels.token_logprobs(sliced, targets, backend="triton")
    logp.sum().backward()
    ref_base = full.clone().requires_grad_()
    ref_logp, _ = kernels.token_logprobs(ref_base[:, :-1], targets, backend="torch")
    ref_logp.sum().backward()
    close(logp, ref_logp, torch.float32, "logp")
    close(base.grad, ref_base.grad, torch.float32, "dlogits")
    assert base.grad[:, -1].abs().max() == 0


def test_token_logprobs_neg_inf_columns():
    """Vocabulary padding masked with -inf: finite logp, entropy and gradients."""
    logits = torch.randn(4, 200)
    logits[:, 150:] = float("-inf")
    logits.requires_grad_()
    targets = torch.randint(0, 150, (4,))
    logp, ent = logprob_op.token_logprobs(logits, targets, 64)
    (logp + ent).sum().backward()
    ref_logp, ref_ent = reference.token_logprobs(logits.detach()[:, :150], targets)
    close(logp, ref_logp, torch.float32, "logp")
    close(ent, ref_ent, torch.float32, "entropy")
    assert torch.isfinite(logits.grad).all() and logits.grad[:, 150:].abs().max() == 0


# ------------------------------------------------------------------------ fused linear log-probs

# (token shape, H, V, chunk_size, vocab block)
FUSED_CASES = [
    ((1,), 16, 100, None, None),      # a single token
    ((37,), 24, 423, 8, 64),          # ragged last chunk, ragged last vocab block
    ((2, 9), 32, 257, None, 64),      # batch dims, auto chunk
    ((13,), 8, 50, 64, None),         # one chunk larger than N
]


def _fused_inputs(tok_shape, H, V, dtype):
    hidden = torch.randn(*tok_shape, H).to(dtype).requires_grad_()
    weight = (torch.randn(V, H) / H ** 0.5 * 2).to(dtype).requires_grad_()
    targets = torch.randint(0, V, tok_shape)
    return hidden, weight, targets


def _ref_leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tok_shape,H,V,chunk,block", FUSED_CASES, ids=str)
def test_fused_linear_logprobs_matches_reference(tok_shape, H, V, chunk, block, dtype):
    hidden, weight, targets = _fused_inputs(tok_shape, H, V, dtype)
    g_logp, g_ent = torch.randn(tok_shape), torch.randn(tok_shape)
    h2, t1 = hidden.reshape(-1, H), targets.reshape(-1)
    chunk = chunk or fused_op.auto_chunk_size(h2.shape[0], H, V)
    logp, ent = fused_op.FusedLinearLogProbsFunction.apply(h2, weight, t1, chunk, block)
    (logp * g_logp.reshape(-1) + ent * g_ent.reshape(-1)).sum().backward()

    rh, rw = _ref_leaves(hidden, weight)
    ref_logp, ref_ent = reference.fused_linear_logprobs(rh, rw, targets)
    (ref_logp * g_logp + ref_ent * g_ent).sum().backward()

    # half-precision logits are rounded once in both paths, but chunked and whole matmuls may
    # round differently: outputs get the dtype's tolerance.
    close(logp.view(tok_shape), ref_logp, dtype, "logp")
    close(ent.view(tok_shape), ref_ent, dtype, "entropy")
    close(hidden.grad, rh.grad, dtype, "dhidden")
    close(weight.grad, rw.grad, dtype, "dweight")


def test_fused_linear_logprobs_public_api_and_no_grad():
    hidden, weight, targets = _fused_inputs((3, 7), 16, 129, torch.float32)
    logp, ent = kernels.fused_linear_logprobs(hidden, weight, targets, backend="triton", chunk_size=4)
    ref_logp, ref_ent = kernels.fused_linear_logprobs(hidden, weight, targets, backend="torch")
    assert logp.shape == targets.shape
    close(logp, ref_logp, torch.float32, "logp")
    close(ent, ref_ent, torch.float32, "entropy")
    with torch.no_grad():  # how the trainer computes old / reference log-probs
        logp_ng, _ = kernels.fused_linear_logprobs(hidden, weight, targets, backend="triton", chunk_size=4)
    assert logp_ng.grad_fn is None
    torch.testing.assert_close(logp_ng, logp.detach(), atol=0, rtol=0)


# ------------------------------------------------------------------------------ fused GRPO loss

def _grpo_inputs(tok_shape, H, V, dtype, mask_frac=0.3, with_old=True, with_ref=True):
    hidden, weight, targets = _fused_inputs(tok_shape, H, V, dtype)
    with torch.no_grad():
        logp, _ = reference.fused_linear_logprobs(hidden, weight, targets)
    # old / ref log-probs near the current ones so that ratios straddle the clip range
    old = logp + 0.3 * torch.randn(tok_shape) if with_old else None
    ref = logp + 0.3 * torch.randn(tok_shape) if with_ref else None
    adv = torch.randn(tok_shape)
    mask = (torch.rand(tok_shape) >= mask_frac).float()
    return hidden, weight, targets, old, ref, adv, mask


# (token shape, H, V, chunk_size, vocab block, clip_eps, kl_coef, with_old, mask_frac)
GRPO_CASES = [
    ((1,), 16, 100, None, None, 0.2, 0.1, True, 0.0),             # a single token
    ((37,), 24, 423, 8, 64, 0.2, 0.04, True, 0.3),                # padding mask, ragged chunks
    ((3, 11), 16, 257, None, 64, (0.2, 0.28), 0.0, True, 0.3),    # clip-higher, no KL, batch dims
    ((20,), 12, 77, 6, None, 0.1, 0.5, False, 0.5),               # old_logp None (r == 1)
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tok_shape,H,V,chunk,block,clip_eps,kl_coef,with_old,mask_frac", GRPO_CASES, ids=str)
def test_fused_linear_grpo_loss_matches_reference(tok_shape, H, V, chunk, block, clip_eps, kl_coef,
                                                  with_old, mask_frac, dtype):
    hidden, weight, targets, old, ref, adv, mask = _grpo_inputs(
        tok_shape, H, V, dtype, mask_frac, with_old, with_ref=kl_coef > 0)
    eps_low, eps_high = reference._clip_pair(clip_eps)
    h2 = hidden.reshape(-1, H)
    chunk = chunk or fused_op.auto_chunk_size(h2.shape[0], H, V)

    def flat(t):
        return None if t is None else t.reshape(-1).contiguous()

    loss, logp, ent, clipped, kl = fused_op.FusedLinearGRPOLossFunction.apply(
        h2, weight, targets.reshape(-1), flat(old), flat(ref), flat(adv), flat(mask),
        eps_low, eps_high, kl_coef, chunk, True, True, block)
    loss.backward()

    rh, rw = _ref_leaves(hidden, weight)
    ref_loss, ref_stats = reference.fused_linear_grpo_loss(rh, rw, targets, old, ref, adv, mask, clip_eps, kl_coef)
    ref_loss.backward()

    close(loss, ref_loss, dtype, "loss")
    close(logp.view(tok_shape), ref_stats["logp"], dtype, "logp")
    close(ent.view(tok_shape), ref_stats["entropy"], dtype, "entropy")
    n = mask.sum().clamp(min=1)
    if dtype == torch.float32:  # near a clip boundary, half precision may flip a token
        close(clipped.sum() / n, ref_stats["clip_frac"], dtype, "clip_frac")
    close(kl.sum() / n, ref_stats["kl"], dtype, "kl")
    close(hidden.grad, rh.grad, dtype, "dhidden")
    close(weight.grad, rw.grad, dtype, "dweight")
    assert (hidden.grad.reshape(-1, H)[mask.reshape(-1) == 0] == 0).all()


def test_grpo_public_api_stats_and_clipping():
    hidden, weight, targets, old, ref, adv, mask = _grpo_inputs((4, 16), 16, 211, torch.float32)
    args = (targets, old, ref, adv, mask, 0.2, 0.05)
    loss, stats = kernels.fused_linear_grpo_loss(hidden, weight, *args, backend="triton", chunk_size=16)
    rh, rw = _ref_leaves(hidden, weight)
    ref_loss, ref_stats = kernels.fused_linear_grpo_loss(rh, rw, *args, backend="torch")
    loss.backward()
    ref_loss.backward()
    assert set(stats) == set(ref_stats) == {"logp", "entropy", "clip_frac", "kl"}
    for k, v in stats.items():
        assert not v.requires_grad, k
        close(v, ref_stats[k], torch.float32, k)
    assert 0 < stats["clip_frac"] < 1, "the inputs should exercise both clipped and unclipped tokens"
    close(hidden.grad, rh.grad, torch.float32, "dhidden")
    close(weight.grad, rw.grad, torch.float32, "dweight")
    # per-sequence advantages broadcast over tokens
    loss_seq, _ = kernels.fused_linear_grpo_loss(hidden.detach(), weight.detach(), targets, old, ref,
                                                 adv[:, 0], mask, 0.2, 0.05, backend="triton")
    loss_tok, _ = kernels.fused_linear_grpo_loss(hidden.detach(), weight.detach(), targets, old, ref,
                                                 adv[:, :1].expand_as(adv), mask, 0.2, 0.05, backend="torch")
    close(loss_seq, loss_tok, torch.float32, "loss with (B,) advantages")


def test_grpo_chunking_does_not_change_results():
    """Chunking is the memory saving; results must not depend on it (1 token, odd, all at once)."""
    hidden, weight, targets, old, ref, adv, mask = _grpo_inputs((29,), 16, 300, torch.float32)
    results = []
    for chunk in (1, 7, 29):
        h, w = _ref_leaves(hidden, weight)
        loss, stats = kernels.fused_linear_grpo_loss(h, w, targets, old, ref, adv, mask, 0.2, 0.1,
                                                     backend="triton", chunk_size=chunk)
        loss.backward()
        results.append((loss, stats["logp"], stats["entropy"], h.grad, w.grad))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_grpo_masked_tokens_contribute_nothing():
    """Garbage (nan, inf, huge) in masked tokens changes nothing: same as dropping them."""
    hidden, weight, targets, old, ref, adv, mask = _grpo_inputs((24,), 16, 150, torch.float32, mask_frac=0.4)
    keep = mask.bool()
    old, ref, adv = old.clone(), ref.clone(), adv.clone()
    old[~keep], ref[~keep], adv[~keep] = float("nan"), float("-inf"), 1e30
    loss, stats = kernels.fused_linear_grpo_loss(hidden, weight, targets, old, ref, adv, mask, 0.2, 0.1,
                                                 backend="triton", chunk_size=5)
    loss.backward()
    rh, rw = _ref_leaves(hidden, weight)
    ref_loss, ref_stats = reference.fused_linear_grpo_loss(rh[keep], rw, targets[keep], old[keep], ref[keep],
                                                           adv[keep], mask[keep], 0.2, 0.1)
    ref_loss.backward()
    close(loss, ref_loss, torch.float32, "loss")
    for k in ("clip_frac", "kl"):
        close(stats[k], ref_stats[k], torch.float32, k)
    close(hidden.grad[keep], rh.grad[keep], torch.float32, "dhidden (kept)")
    assert hidden.grad[~keep].abs().max() == 0
    close(weight.grad, rw.grad, torch.float32, "dweight")


def test_grpo_all_masked_frozen_weight_and_single_backward():
    hidden, weight, targets, old, ref, adv, mask = _grpo_inputs((6,), 8, 40, torch.float32)
    weight.requires_grad_(False)
    loss, stats = kernels.fused_linear_grpo_loss(hidden, weight, targets, old, ref, adv, torch.zeros(6),
                                                 0.2, 0.1, backend="triton")
    loss.backward(retain_graph=True)
    assert loss.item() == 0 and stats["clip_frac"].item() == 0 and stats["kl"].item() == 0
    assert hidden.grad.abs().max() == 0 and weight.grad is None
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()
    with torch.no_grad():
        loss_ng, _ = kernels.fused_linear_grpo_loss(hidden, weight, targets, old, ref, adv, mask, 0.2, 0.1,
                                                    backend="triton")
    assert loss_ng.grad_fn is None


def test_grpo_module_wrapper():
    hidden, weight, targets, old, ref, adv, mask = _grpo_inputs((9,), 8, 60, torch.float32)
    module = FusedLinearGRPOLoss(clip_eps=0.2, kl_coef=0.1, backend="triton", chunk_size=4)
    loss, _ = module(hidden, weight, targets, old, ref, adv, mask)
    ref_loss, _ = reference.fused_linear_grpo_loss(hidden, weight, targets, old, ref, adv, mask, 0.2, 0.1)
    close(loss, ref_loss, torch.float32, "loss")


# ------------------------------------------------------------------------------------- RMSNorm

RMS_SHAPES = [(1, 1), (1, 64), (3, 42, 213), (2, 5, 1000)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", RMS_SHAPES, ids=str)
def test_rms_norm_matches_reference(shape, dtype):
    x = (torch.randn(shape) * 3).to(dtype).requires_grad_()
    w = (1 + 0.5 * torch.randn(shape[-1])).to(dtype).requires_grad_()
    g = torch.randn(shape).to(dtype)
    y = kernels.rms_norm(x, w, 1e-5, backend="triton")
    (y.float() * g.float()).sum().backward()
    rx, rw = _ref_leaves(x, w)
    ry = kernels.rms_norm(rx, rw, 1e-5, backend="torch")
    (ry.float() * g.float()).sum().backward()
    assert y.dtype == dtype and y.shape == x.shape
    close(y, ry, dtype, "y")
    close(x.grad, rx.grad, dtype, "dx")
    # dw sums over rows: its error grows with the row count in half precision
    tol = TOL[dtype] if dtype == torch.float32 else dict(atol=TOL[dtype]["atol"] * 10, rtol=TOL[dtype]["rtol"] * 2)
    torch.testing.assert_close(w.grad.float(), rw.grad.float(), **tol)


def test_rms_norm_module_is_a_drop_in():
    plain = torch.nn.RMSNorm(96, eps=1e-6)
    with torch.no_grad():
        plain.weight.mul_(torch.rand(96) + 0.5)
    ours = RMSNorm(96, eps=1e-6, backend="triton")
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in plain.named_parameters()]
    ours.load_state_dict(plain.state_dict())
    x = torch.randn(4, 7, 96)
    close(ours(x), plain(x), torch.float32, "RMSNorm vs torch.nn.RMSNorm")
    with pytest.raises(ValueError, match="backend"):
        RMSNorm(8, backend="cuda")


# ----------------------------------------------------------------------------- benchmark script

def _bench_module():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "kernels" / "bench_kernels.py"
    spec = importlib.util.spec_from_file_location("bench_kernels", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_bench_script_smoke(tmp_path, capsys):
    """The GPU benchmark script runs end to end (tiny, interpreter) and refuses a CPU full sweep."""
    torch.set_default_device("cpu")  # the script makes its own inputs, on its own device
    bench = _bench_module()
    if not torch.cuda.is_available():
        assert bench.main(["--out", str(tmp_path)]) == 2
        assert "no CUDA device" in capsys.readouterr().err
    rc = bench.main(["--smoke", "--ops", "rms_norm", "fused_linear_grpo_loss", "--impls", "triton", "eager",
                     "--tokens", "8", "--hidden", "16", "--vocab", "100", "--out", str(tmp_path)])
    assert rc == 0
    for name in ("results.json", "results.csv", "results.md", "results.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    import json
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert len(rows) == 2 * 2 * 2 and all(r["status"] == "ok" for r in rows)
