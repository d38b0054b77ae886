"""Runnable companions of the learning path (docs/learn/): small, readable code that a page runs
and a test checks. Nothing here is used by the trainers.

- minimal_ppo:   a whole PPO loop in one file, torch and transformers only, to read first (docs/learn/README.md)
- bandit:        policy gradients from scratch on a categorical bandit (REINFORCE vs PPO-clip), entry 2
- ppo_reference: one PPO iteration written out on `rlhfkit.algos` only, entry 1
- breaks:        classic bugs made on purpose with their symptoms (`rlhfkit selfcheck --break NAME`), entry 30
- tiny:          a random 2-layer Llama that PPO teaches to use vowels in seconds (`python -m rlhfkit.learn.tiny`), entry 0
- ablations:     PPO's knobs one at a time over seeds on the tiny vowel task (`python -m rlhfkit.learn.ablations`)
- exercises/:    five stubs for the learner to fill in (GAE, the clipped loss, the KL reward, group advantages, DPO)
- exercise_check: checks a learner's function against rlhfkit's on random tensors (`rlhfkit selfcheck --exercise`);
  exercise_cases: the exercises it checks (inputs, reference, classic bugs)
"""
