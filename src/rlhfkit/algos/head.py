"""Token log-probs (and entropy) straight from final hidden states: the output layer, the
log-softmax and the gather in one autograd node, so no (N, V) logits are kept for backward.

The plain way, `logprobs_and_entropy(lm_head(hidden), tokens)`, makes about ten (N, V) float32
temporaries per micro-batch between its forward and backward (logits, z - lse, exp, their
gradients, ...). With N ~ 300 positions and V ~ 49k each is ~60 MB, a fresh allocation that the
allocator returns to the OS when it is freed, so on CPU their page faults cost more than their
arithmetic. Here the forward makes two (N, V) buffers (logits, then log-softmax; probabilities)
and works in them in place; when the output layer is frozen (LoRA) it also folds them into the
two (N, H) factors of the gradient, so the backward is a multiply-add and the buffers are dead
before the backward starts: then, on the CPU, they are a workspace reused by the next call.

Maths (z = logits / T, p = softmax(z), a token y, upstream gradients a = dL/dlog p(y) and
b = dL/dH per row):
    log p(y) = z_y - logsumexp(z)            H = -sum_v p_v log p_v
    dL/dz    = a (onehot(y) - p) - b p (log p + H)
    dL/dh    = (dL/dz / T) @ W               dL/dW = (dL/dz / T)^T @ h

Notation: B batch, R response length, N rows (positions), H hidden size, V vocabulary.
"""

from __future__ import annotations

import threading

import torch
from torch import nn
from torch.nn import functional as F

from .logprobs import _check_temperature, logprobs_and_entropy

__all__ = ["head_logprobs", "softcap_logits", "HEAD_CHUNK_ELEMENTS"]

# Rows per chunk = this // V: bounds each (rows, V) float32 buffer to 256 MB (1365 rows of a 49k
# vocabulary, so a CPU micro-batch is one chunk: fewer, larger matmuls run faster).
HEAD_CHUNK_ELEMENTS = 2**26


class _HeadLogprobs(torch.autograd.Function):
    """(log p(tokens) (N,), entropy (N,) or None) of softmax((hidden @ W^T + b) / T)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature: float, with_entropy: bool, entropy_grad: bool):
        ctx.frozen = not (ctx.needs_input_grad[1] or ctx.needs_input_grad[2])
        # The two (N, V) buffers are saved for the backward only when the head trains; otherwise
        # they are dead once this returns, and on the CPU they come from a reused workspace.
        z, p = _buffers(hidden.shape[0], weight.shape[0], hidden.device, reuse=ctx.frozen)
        if hidden.dtype == weight.dtype == torch.float32:
            torch.mm(hidden, weight.t(), out=z)
        else:  # bf16 logits, kept in float32
            z.copy_(F.linear(hidden, weight))
        if bias is not None:
            z.add_(bias)
        if temperature != 1.0:
            z.div_(temperature)
        z.sub_(z.amax(dim=-1, keepdim=True))  # z - max: exp cannot overflow
        torch.exp(z, out=p)
        sums = p.sum(dim=-1, keepdim=True)  # (N, 1)
        log_sums = sums.log()
        logp = z.gather(1, tokens[:, None]).squeeze(1) - log_sums.squeeze(1)
        log_p = z.sub_(log_sums)  # log-softmax, in place
        p.div_(sums)  # softmax, in place
        ent = _row_dots(p, log_p).neg_() if with_entropy else None
        ent_grad = with_entropy and entropy_grad
        ctx.temperature, ctx.hidden_dtype = temperature, hidden.dtype
        if ctx.needs_input_grad[0] and ctx.frozen:
            # Frozen head: dL/dh = a * J_lp + b * J_ent, both (N, H), computed now.
            w = weight.to(hidden.dtype) if hidden.dtype != weight.dtype else weight
            j_lp = (w[tokens] - p.to(w.dtype) @ w) / temperature
            j_ent = -(p.mul_(log_p.add_(ent[:, None])).to(w.dtype) @ w) / temperature if ent_grad else None
            ctx.save_for_backward(j_lp, j_ent)
        elif not ctx.frozen:
            ctx.save_for_backward(hidden, weight, tokens, p, log_p if ent_grad else None, ent if ent_grad else None)
        if with_entropy and not ent_grad:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, grad_ent):
        if ctx.frozen:
            j_lp, j_ent = ctx.saved_tensors
            grad_h = grad_logp[:, None].to(j_lp.dtype) * j_lp
            if j_ent is not None and grad_ent is not None:
                grad_h = grad_h + grad_ent[:, None].to(j_ent.dtype) * j_ent
            return grad_h.to(ctx.hidden_dtype), None, None, None, None, None, None
        # dL/dz = a onehot(y) - p (a + b (log p + H)), built in the saved buffers, so this runs once.
        if getattr(ctx, "spent", False):
            raise RuntimeError("head_logprobs with a trained output layer supports one backward pass (no retain_graph)")
        ctx.spent = True
        hidden, weight, tokens, p, log_p, ent = ctx.saved_tensors
        coef = grad_logp[:, None].float()
        if log_p is not None and grad_ent is not None:
            coef = log_p.add_(ent[:, None]).mul_(grad_ent[:, None].float()).add_(coef)
        g = p.mul_(coef).neg_()
        g.scatter_add_(1, tokens[:, None], grad_logp[:, None].float())
        if ctx.temperature != 1.0:
            g.div_(ctx.temperature)
        g = g.to(weight.dtype)
        grad_h = (g @ weight).to(ctx.hidden_dtype) if ctx.needs_input_grad[0] else None
        grad_w = g.t() @ hidden.to(weight.dtype) if ctx.needs_input_grad[1] else None
        grad_b = g.sum(0) if ctx.needs_input_grad[2] else None
        return grad_h, grad_w, grad_b, None, None, None, None


def head_logprobs(
    hidden: torch.Tensor,
    head: nn.Module,
    tokens: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `tokens` (B, R) and the entropy (B, R) of softmax(head(hidden) / temperature).

    hidden: (B, R, H) final hidden states predicting `tokens`; head: the output layer (an
    nn.Linear; any other module, or a weight sharded by an engine, is applied and its logits go
    through `logprobs_and_entropy`);
    mask: (B, R), rows where it is 0 are skipped and read 0 (None: every row). `entropy_grad=False`
    returns the entropy as a constant (for a metric; saves an (N, V) product). Both float32, equal
    to the plain path up to float rounding. Row chunks of HEAD_CHUNK_ELEMENTS // V bound memory.
    `softcap`: the model's final-logit soft-cap c (Gemma 2: logits -> c tanh(logits / c), before the
    temperature), applied on the plain path.
    """
    _check_temperature(temperature)
    lead = tokens.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    tok = tokens.reshape(-1).long()
    keep = None if mask is None else mask.reshape(-1).nonzero().squeeze(1)
    if keep is not None:
        h, tok = h.index_select(0, keep), tok.index_select(0, keep)
    if _fusable(head) and not softcap:
        step = max(1, HEAD_CHUNK_ELEMENTS // head.out_features)
        parts = [_HeadLogprobs.apply(h[i : i + step], head.weight, head.bias, tok[i : i + step], float(temperature),
                                     with_entropy, entropy_grad) for i in range(0, max(len(tok), 1), step)]
        if len(tok) == 0:  # every row masked: keep shapes (a (0, V) chunk computes nothing)
            parts = parts[:1]
        logp = torch.cat([lp for lp, _ in parts])
        ent = torch.cat([e for _, e in parts]) if with_entropy else None
    else:
        logp, ent = logprobs_and_entropy(softcap_logits(head(h), softcap)[None], tok[None], temperature, with_entropy)
        logp, ent = logp[0], (ent[0] if ent is not None else None)
        if ent is not None and not entropy_grad:
            ent = ent.detach()
    return _scatter(logp, keep, lead), (_scatter(ent, keep, lead) if ent is not None else None)


def softcap_logits(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """c * tanh(logits / c), the final-logit soft-cap of Gemma 2 (`final_logit_softcapping`); the
    logits unchanged when `softcap` is None or 0."""
    if not softcap:
        return logits
    return torch.tanh(logits / softcap) * softcap


_workspace = threading.local()  # per thread: {device: flat float32 tensor}


def _buffers(rows: int, vocab: int, device: torch.device, reuse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Two (rows, vocab) float32 buffers. With `reuse` on the CPU they are views of one workspace
    per thread and device that only grows, so the next call touches no fresh pages (glibc maps
    blocks this big freshly on every allocation); otherwise new tensors, and the workspace is let
    go: a trained head (full fine-tuning) runs at the memory peak, where it would be dead weight."""
    n = rows * vocab
    spaces = getattr(_workspace, "spaces", None)
    if spaces is None:
        spaces = _workspace.spaces = {}
    if not reuse or device.type != "cpu":
        spaces.pop(device, None)
        return torch.empty(rows, vocab, device=device), torch.empty(rows, vocab, device=device)
    space = spaces.get(device)
    if space is None or space.numel() < 2 * n:
        space = spaces[device] = torch.empty(2 * n, device=device)
    return space[:n].view(rows, vocab), space[n : 2 * n].view(rows, vocab)


def _row_dots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum_v a[n, v] b[n, v] (N,) for (N, V) a and b, in their dtype, a few rows at a time: no (N, V)
    product (at N = 192, V = 49152 a fresh 38 MB block, page-faulted on every call) and no matmul,
    which autocast would run in bf16 (a batched matmul here copied both operands to bf16: ~50 ms a call)."""
    out = a.new_empty(a.shape[0])
    step = max(1, 2**20 // max(a.shape[1], 1))  # 4 MB float32 temporaries: from the heap, reused
    for i in range(0, a.shape[0], step):
        torch.sum(a[i : i + step] * b[i : i + step], dim=1, out=out[i : i + step])
    return out


def _fusable(head: nn.Module) -> bool:
    """A plain nn.Linear whose weight is a whole local tensor. The fused path reads `head.weight`
    without calling the module, so weights that an engine gathers in module hooks (DeepSpeed
    ZeRO-3 partitions, FSDP DTensors or flat-parameter views) go through `head(hidden)` instead."""
    if not isinstance(head, nn.Linear):
        return False
    w = head.weight
    return (not hasattr(w, "ds_id") and type(w.data) is torch.Tensor
            and tuple(w.shape) == (head.out_features, head.in_features))


def _scatter(values: torch.Tensor, keep: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
    """Values of the kept rows back at their places in a zero (B, R) tensor."""
    if keep is None:
        return values.reshape(shape)
    out = values.new_zeros(shape.numel())
    return out.index_copy(0, keep, values).reshape(shape)
