"""Harness: prompt template, answer format, sampling, reward, curriculum and data filters, versioned by content hash."""
from harness.spec import AnswerFormat, Curriculum, DataFilters, HarnessSpec, RewardConfig, Sampling

__all__ = ["AnswerFormat", "Curriculum", "DataFilters", "HarnessSpec", "RewardConfig", "Sampling"]
