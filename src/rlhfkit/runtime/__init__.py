"""The run harness every trainer stands on: the run (run.py), run folders, checkpoints, the tracker,
distribution (DDP, FSDP2), the gradient-accumulation step, optimiser and fault handling."""
