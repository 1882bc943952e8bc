"""Training algorithms: SFT, GRPO, distill (rejection-sampling fine-tuning), and their registries."""
