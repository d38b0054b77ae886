"""Every trainer sets its modes itself: with gradient_checkpointing=true the layers really recompute
(transformers checkpoints only in train mode; DPO never entered it, PPO/GRPO only by side effect)."""

from __future__ import annotations

import pytest
from test_resume import TRAINERS, _train, make_cfg


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_gradient_checkpointing_recomputes_in_every_trainer(name, tmp_path, tiny_model_dir, patch_everywhere):
    import rlhfkit.models.loading as loading

    calls = {"n": 0}
    real = loading.set_gradient_checkpointing

    def counting(model, enabled=True):
        real(model, enabled)
        for module in model.modules():  # wrap the checkpoint function each layer was given
            func = getattr(module, "_gradient_checkpointing_func", None)
            if func is not None and getattr(module, "gradient_checkpointing", False):
                def wrapped(*a, _f=func, **k):
                    calls["n"] += 1
                    return _f(*a, **k)

                module._gradient_checkpointing_func = wrapped
        return model

    train = _train(name)  # its modules loaded, so the patch reaches their imports
    patch_everywhere(loading, "set_gradient_checkpointing", counting)
    cfg = make_cfg(name, tmp_path, tiny_model_dir, "gc", gradient_checkpointing=True, save_every=0)
    cfg = make_cfg(name, tmp_path, tiny_model_dir, "gc", gradient_checkpointing=True, save_every=0,
                   **({"iterations": 1} if hasattr(cfg, "iterations") else {"max_steps": 1}))  # configs are frozen
    train(cfg)
    assert calls["n"] > 0, f"{name}: gradient_checkpointing=true never recomputed a layer"
