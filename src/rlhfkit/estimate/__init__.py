"""Arithmetic on a model's shape: its sizes (shape.py), FLOP counts (flops.py) and the memory a run
needs (memory.py), for `rlhfkit estimate-memory`, the trainers' fit checks and the benches."""
