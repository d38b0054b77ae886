"""Exercises of the learning path: five functions for the learner to write, one stub file each.

Copy a stub, fill in its function, then check it against rlhfkit's own on random tensors:

    cp "$(python -c 'import rlhfkit.learn.exercises as e; print(e.__path__[0])')/gae.py" my_gae.py
    rlhfkit selfcheck --exercise gae my_gae.py

- gae.py:              gae(rewards, values, mask, gamma, lam) -> (advantages, returns)
- policy_loss.py:      policy_loss(logp, old_logp, advantages, mask, clip_eps) -> loss
- kl_reward.py:        kl_reward(scores, logp, ref_logp, mask, kl_coef) -> rewards
- group_advantages.py: group_advantages(scores, group_size) -> advantages
- dpo_loss.py:         dpo_loss(pi_chosen, pi_rejected, ref_chosen, ref_rejected, beta) -> losses

The checker lives in rlhfkit.learn.exercise_check; the stubs import torch only.
"""
