"""Rollouts: batched sampled generation (core.py), then one teacher-forced log-prob pass (logprobs.py)."""

from rlhfkit.rollout.core import Rollout, SamplingParams, generate
from rlhfkit.rollout.logprobs import forward_logprobs, logprob_pass

__all__ = ["Rollout", "SamplingParams", "forward_logprobs", "generate", "logprob_pass"]
