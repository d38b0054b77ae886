"""FSDP2's gradients through the trainers' forward equal the unsharded model's, and the sharded
root returns no views (torch warned "returned a view tensor ... can produce wrong gradients" once
per FSDP2 PPO, GRPO and DPO run: the log-probs and values of `ActorCritic.forward` were reshapes).

tests/scale/fsdp2_gradient_worker.py runs on 2 gloo processes (a few seconds): the sharded copy's
gradient, averaged over the processes' rows by FSDP2's reduce-scatter, against the whole copy's
gradient of the mean loss over the same rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_ddp import free_port, worker_env

WORKER = Path(__file__).with_name("fsdp2_gradient_worker.py")
# float32 sums in another order (a reduce-scatter of two halves against one backward through both);
# a gradient that missed the hook (no all-gather, unreduced) is off by O(1) of its norm.
REL = 1e-5


def test_sharded_gradients_equal_the_unsharded_ones_and_no_view_is_returned(tmp_path):
    out = tmp_path / "grads.json"
    env = {**worker_env(), "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"),
                                                          os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), str(WORKER), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [w for w in result["warnings"] if "view tensor" in w] == []
    grads = result["grads"]
    assert len(grads) >= 10 and any(n.startswith("value_head.") for n in grads)
    for name, (norm, error) in grads.items():
        assert norm > 0, f"{name}: no gradient"
        assert error <= REL * norm, f"{name}: error {error:.3g}, {error / norm:.3g} of the gradient's norm"
