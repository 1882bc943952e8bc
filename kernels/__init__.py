"""Triton kernels for the trainer hot paths (fused log-prob, fused linear GRPO loss, RMSNorm)."""
