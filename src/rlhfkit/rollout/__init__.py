"""Rollouts: batched sampled generation, then one teacher-forced scoring pass."""

from rlhfkit.rollout.core import Rollout, SamplingParams, forward_logprobs, generate, score_rollout

__all__ = ["Rollout", "SamplingParams", "forward_logprobs", "generate", "score_rollout"]
