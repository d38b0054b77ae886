"""The response-token negative log-likelihood of a causal LM: SFT's loss (trainers/sft.py) and the
reference-response perplexity of `rlhfkit evaluate` (evaluate.py), here below both of them."""

from __future__ import annotations

import torch
from torch import nn

from rlhfkit.algos import logprobs_from_logits
from rlhfkit.core.precision import autocast
from rlhfkit.data.chat import IGNORE_INDEX
from rlhfkit.data.sft import collate
from rlhfkit.models.policy import output_logits
from rlhfkit.models.trunk import position_ids_from_mask


class ResponseNLL(nn.Module):
    """Per-token negative log-likelihood of the labelled (response) tokens.

    forward(input_ids, attention_mask, labels[, position_ids]) -> (nll (B, L-1), mask (B, L-1));
    position t predicts token t+1, and the LM head runs only where a label exists (prompt logits
    are never computed). Packed rows give `position_ids` that restart per example and no mask:
    transformers then lets each example attend only to itself. Wrapping the model in one module
    lets Accelerate/DDP see the forward.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, labels, position_ids=None):
        get_base = getattr(self.model, "get_base_model", None)
        lm = get_base() if callable(get_base) else self.model  # LoRA layers stay injected
        if position_ids is not None:  # packed: the restarts of position_ids mark the examples
            attention_mask = None
        else:
            position_ids = position_ids_from_mask(attention_mask)
        hidden = lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                  use_cache=False).last_hidden_state[:, :-1]  # (B, L-1, H)
        targets = labels[:, 1:]  # (B, L-1)
        mask = targets != IGNORE_INDEX
        logits = output_logits(lm, hidden[mask])  # (N, V), N labelled tokens
        nll = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
        nll[mask] = -logprobs_from_logits(logits, targets[mask])
        return nll, mask


@torch.no_grad()
def mean_nll(module: nn.Module, examples: list[dict], pad_id: int, micro_batch_size: int, dtype: str,
             device) -> tuple[float, int]:
    """(token-mean NLL over all labelled tokens, number of tokens) of tokenised examples."""
    was_training = module.training
    module.eval()
    total, n = 0.0, 0
    for i in range(0, len(examples), micro_batch_size):
        b = {k: v.to(device) for k, v in collate(examples[i : i + micro_batch_size], pad_id).items()}
        with autocast(dtype, device):
            nll, mask = module(**b)
        total += nll.sum().item()
        n += int(mask.sum().item())
    module.train(was_training)
    return total / max(n, 1), n
