"""Actor-critic: a causal LM with a scalar value head, and its frozen reference.

Notation: B batch, L = P + R tokens (left-padded prompt of width P, response of width R),
H hidden size, V vocabulary.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
from pathlib import Path

import torch
from torch import nn

from rlhfkit.algos.head import head_logprobs, softcap_logits
from rlhfkit.models.loading import save_tokenizer
from rlhfkit.models.shared_prompts import response_hidden, shared_prefix_hidden
from rlhfkit.models.trunk import frozen_depth, position_ids_from_mask, top_states, trunk_states

VALUE_HEAD_FILE = "value_head.safetensors"


class ValueHead(nn.Module):
    """Linear map from the final hidden state to a scalar value; zero-initialised
    (docs/pitfalls.md#value-head-init).

    A zero head predicts V = 0 everywhere at the start, so the first advantages equal the
    (shaped) rewards instead of being dominated by a random critic. No dropout.
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        self.summary = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.summary.weight)
        nn.init.zeros_(self.summary.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (B, K, H) -> (B, K)
        with torch.autocast(hidden.device.type, enabled=False):  # values stay fp32 under bf16 autocast
            return self.summary(hidden.to(self.summary.weight.dtype)).squeeze(-1)


def _unwrap(model: nn.Module) -> nn.Module:
    """The transformers model under a peft wrapper (LoRA layers stay injected)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def final_softcap(lm: nn.Module) -> float | None:
    """The final-logit soft-cap the model applies after its output layer (Gemma 2), or None."""
    return getattr(lm.config, "final_logit_softcapping", None)


def output_logits(lm: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The causal LM's logits from its final hidden states, as its own forward computes them: the
    output layer, then the soft-cap where the model has one. (..., H) -> (..., V)"""
    return softcap_logits(lm.get_output_embeddings()(hidden), final_softcap(lm))


def output_width(lm: nn.Module) -> int:
    """Width of the decoder's final hidden states: `hidden_size`, except where the model projects
    its residual stream to the embedding width first (OPT's word_embed_proj_dim: opt-350m 1024 -> 512)."""
    cfg = lm.config
    return getattr(cfg, "word_embed_proj_dim", None) or cfg.hidden_size


def response_hidden_states(decoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           num_response: int, share_prompts: bool = False,
                           trunk: tuple[int, torch.Tensor] | None = None, share_prefix: bool = False) -> torch.Tensor:
    """Final hidden states (B, R, H) of the positions predicting the R response tokens: response
    token i is predicted from position P-1+i (docs/pitfalls.md#off-by-one), so positions
    [L-R-1, L-1) are kept.
    `share_prompts`: rows with the same prompt run it once (equal up to float rounding).
    `share_prefix`: the prompt prefix every row shares runs once (equal up to float rounding); with
    `share_prompts`, only on top of shared prompts, where it saves enough (shared_prompts.py).
    `trunk`: (depth D, states (B, L, H) after the frozen bottom D layers): only the layers above
    them run (models/trunk.py)."""
    pos = position_ids_from_mask(attention_mask)
    if trunk is not None:
        depth, states = trunk
        return top_states(decoder, depth, states, attention_mask, pos)[:, -num_response - 1 : -1]
    if share_prompts:
        hidden = response_hidden(decoder, input_ids, attention_mask, pos, num_response, share_prefix)
        if hidden is not None:
            return hidden
    elif share_prefix:
        hidden = shared_prefix_hidden(decoder, input_ids, attention_mask, num_response)
        if hidden is not None:
            return hidden
    return decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos,
                   use_cache=False).last_hidden_state[:, -num_response - 1 : -1]


class ActorCritic(nn.Module):
    """Policy LM + value head on the shared base (one forward gives logits and values),
    or on a separate critic backbone when `critic` is given. `value_head=None` gives a
    policy-only model (GRPO, RLOO, DPO): values are then always None.
    """

    def __init__(self, policy: nn.Module, value_head: ValueHead | None, critic: nn.Module | None = None,
                 share_prompts: bool = False, share_prefix: bool = False, value_head_lr: float | None = None):
        super().__init__()
        self.policy = policy
        self.value_head = value_head
        self.critic = critic
        self.value_head_lr = value_head_lr  # the value head's own learning rate (None: the optimiser's)
        self.share_prompts = share_prompts  # run a prompt shared by several rows once (shared_prompts.py)
        self.share_prefix = share_prefix  # run the prompt prefix all rows share once (shared_prompts.py)
        # Frozen bottom layers shared by the policy and the adapter-off reference and reused by
        # every update epoch (models/trunk.py); 0 = none. Prompt sharing takes precedence.
        self.trunk_depth = 0 if share_prompts else frozen_depth(_unwrap(policy).get_decoder())

    @property
    def config(self):
        return _unwrap(self.policy).config

    def parameter_groups(self) -> list[dict]:
        """The optimiser's parameter groups: every parameter in one group, or, when value_head_lr is
        set and there is a value head, the runs of consecutive parameters split where the head's
        begin and end (policy; head at value_head_lr; a separate critic's after it), so the groups
        hold the parameters in their order (`runtime/checkpointer.regroup` reads a one-group
        checkpoint into them)."""
        if self.value_head_lr is None or self.value_head is None:
            return [{"params": list(self.parameters())}]
        in_head = {id(p) for p in self.value_head.parameters()}
        return [{"params": list(run), **({"lr": self.value_head_lr} if head else {})}
                for head, run in itertools.groupby(self.parameters(), key=lambda p: id(p) in in_head)]

    def scoring_shares(self) -> tuple[bool, bool]:
        """(share_prompts, share_prefix) of the scoring and training forwards: both off when FSDP2 shards
        this model (runtime/fsdp2.py). A unit gathers its weights for its forward, frees them after
        it and gathers them again for its backward when the gradient reaches its output; the
        gradient through a shared prompt's cache reaches the keys and values without passing that
        output and would read the freed weights. The reference follows (`Reference`), so step 0
        stays exact; sampling, without gradients, still shares."""
        if _sharded(self):
            return False, False
        return self.share_prompts, self.share_prefix

    def trunk(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor | None:
        """States (B, L, H) after the frozen bottom `trunk_depth` layers (no grad), or None without them."""
        if not self.trunk_depth:
            return None
        return trunk_states(_unwrap(self.policy).get_decoder(), self.trunk_depth, input_ids, attention_mask,
                            position_ids_from_mask(attention_mask))

    def _hidden_and_values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response: int,
                           with_values: bool, trunk: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Final hidden states (B, R, H) of the positions that predict the R response tokens, and the
        values (B, R) (None without a value head or `with_values`).

        The prediction for response token i comes from position P-1+i (docs/pitfalls.md#off-by-one),
        so positions [L-R-1, L-1) are kept. With frozen bottom layers (`trunk_depth`) the pass always
        splits there: `trunk` when the rollout kept it, else recomputed here. The log-prob pass
        splits too, so the first update micro-batch repeats it bit for bit whether or not the trunk
        fitted in `trunk_cache_mb`."""
        lm = _unwrap(self.policy)
        if trunk is None and self.trunk_depth:  # not kept: recomputed, so every pass takes the same path
            trunk = self.trunk(input_ids, attention_mask)
        share_prompts, share_prefix = self.scoring_shares()
        hidden = response_hidden_states(lm.get_decoder(), input_ids, attention_mask, num_response, share_prompts,
                                        (self.trunk_depth, trunk) if trunk is not None else None,
                                        share_prefix)  # (B, R, H)
        values = None
        if with_values and self.value_head is not None:
            if self.critic is not None:
                ch = response_hidden_states(_unwrap(self.critic).get_decoder(), input_ids, attention_mask,
                                            num_response, share_prompts, share_prefix=share_prefix)
                values = self.value_head(ch)
            else:
                values = self.value_head(hidden)
        return hidden, values

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, L)
        attention_mask: torch.Tensor,  # (B, L)
        num_response: int,
        with_values: bool = True,
        response_ids: torch.Tensor | None = None,  # (B, R)
        response_mask: torch.Tensor | None = None,  # (B, R)
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = True,
        trunk: torch.Tensor | None = None,  # (B, L, H) from self.trunk(...): the frozen layers are skipped
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(log-probs (B, R), values (B, R) or None, entropy (B, R) or None) of `response_ids`, the last
        `num_response` tokens, at `temperature`, through the fused output head (algos.head_logprobs:
        no (B, R, V) logits kept). Positions where `response_mask` is 0 are skipped and read 0.
        `entropy_grad=False` gives the entropy as a constant (a metric). The full distributions:
        `logits`."""
        if response_ids is None:
            raise TypeError("ActorCritic.forward needs response_ids; use ActorCritic.logits for (B, R, V) logits")
        hidden, values = self._hidden_and_values(input_ids, attention_mask, num_response, with_values, trunk)
        lm = _unwrap(self.policy)
        logp, ent = head_logprobs(hidden, lm.get_output_embeddings(), response_ids, response_mask,
                                  temperature, with_entropy, entropy_grad, final_softcap(lm))
        if _sharded(self):  # outputs of an FSDP2 root that own their memory (`own_memory`)
            return own_memory(logp), own_memory(values), own_memory(ent)
        return logp, values, ent

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response: int,
               with_values: bool = False, trunk: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits (B, R, V), values (B, R) or None) of the positions that predict the last
        `num_response` tokens, through the same path as `forward`."""
        hidden, values = self._hidden_and_values(input_ids, attention_mask, num_response, with_values, trunk)
        return output_logits(_unwrap(self.policy), hidden), values


class Reference:
    """The frozen reference policy pi_ref.

    With LoRA (docs/pitfalls.md#lora-reference) it is the same model with the adapter disabled:
    no second copy. With full fine-tuning it is a frozen deep copy made before training. `dtype`
    (bf16 runs) stores the copy's linear-layer weights in that dtype (`store_linear_weights`):
    under autocast to it the copy computes bit for bit what the starting policy computes, so the
    KL to the reference is exactly 0 at step 0 and DPO's first loss is exactly log 2.
    `model` gives a separate reference model instead (e.g. DPO's `reference_model`).
    `offload` keeps the frozen copy in CPU memory outside `loaded(device)` (nothing to offload
    with LoRA).
    """

    def __init__(self, actor: ActorCritic, use_adapter_off: bool, dtype: torch.dtype | None = None,
                 model: nn.Module | None = None, offload: bool = False):
        self.actor = actor
        self.frozen: nn.Module | None = None
        if model is not None:
            self.frozen = _unwrap(model).eval().requires_grad_(False)
        elif not use_adapter_off:
            self.frozen = copy.deepcopy(_unwrap(actor.policy)).eval().requires_grad_(False)
        self.dtype = dtype if self.frozen is not None else None  # the autocast dtype its forward runs under
        if self.dtype is not None:
            store_linear_weights(self.frozen, self.dtype)
        self.offload = offload and self.frozen is not None

    def to(self, device: torch.device | str) -> Reference:
        """Place the frozen copy on `device` (the trainer's accelerator), or in CPU memory when offloaded."""
        if self.frozen is not None:
            self.frozen.to("cpu" if self.offload else device)
        return self

    @contextlib.contextmanager
    def loaded(self, device: torch.device | str):
        """The frozen copy on `device` for the wrapped scoring pass; back in CPU memory after it when
        offloaded (one copy each way per pass, not per micro-batch). A no-op otherwise."""
        if not self.offload:
            yield self
            return
        self.frozen.to(device)
        try:
            yield self
        finally:
            self.frozen.to("cpu")
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()

    @contextlib.contextmanager
    def _adapter_off(self):
        with self.actor.policy.disable_adapter():
            yield

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response: int) -> torch.Tensor:
        """Reference logits (B, R, V) of the last `num_response` positions."""
        if self.frozen is None:
            with self._adapter_off():
                logits, _ = self.actor.logits(input_ids, attention_mask, num_response)
            return logits
        with self._autocast(input_ids.device), _root_weights(self.frozen):
            return output_logits(self.frozen, self._frozen_hidden(input_ids, attention_mask, num_response))

    @torch.no_grad()
    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_ids: torch.Tensor,
                 response_mask: torch.Tensor | None = None, temperature: float = 1.0,
                 trunk: torch.Tensor | None = None) -> torch.Tensor:
        """Reference log-probs (B, R) of `response_ids` at `temperature` (fused head; 0 where
        `response_mask` is 0), computed like the policy's so that equal weights give equal bits.
        `trunk`: the policy's frozen-layer states (ActorCritic.trunk), which the adapter-disabled
        reference shares; a separate frozen model ignores it."""
        R = response_ids.shape[1]
        if self.frozen is None:
            with self._adapter_off():
                logp, _, _ = self.actor(input_ids, attention_mask, R, with_values=False, response_ids=response_ids,
                                        response_mask=response_mask, temperature=temperature, trunk=trunk)
            return logp
        with self._autocast(input_ids.device), _root_weights(self.frozen):
            hidden = self._frozen_hidden(input_ids, attention_mask, R)
            return head_logprobs(hidden, self.frozen.get_output_embeddings(), response_ids, response_mask,
                                 temperature, softcap=final_softcap(self.frozen))[0]

    def _autocast(self, device: torch.device):
        """The autocast a `dtype` copy needs (its linear weights are in that dtype); a no-op inside the
        trainers' own autocast to the same dtype, and without `dtype`."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.dtype)

    def _frozen_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response: int) -> torch.Tensor:
        share_prompts, share_prefix = self.actor.scoring_shares()
        return response_hidden_states(self.frozen.get_decoder(), input_ids, attention_mask, num_response,
                                      share_prompts, share_prefix=share_prefix)


def _sharded(model: nn.Module) -> bool:
    """`model` is an FSDP2 unit (runtime/fsdp2.py shards the trainers' model)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def own_memory(t: torch.Tensor | None) -> torch.Tensor | None:
    """`t`, or a copy of it when it is a view of another tensor. The log-probs and values of
    `ActorCritic.forward` are reshapes of the fused head's flat output and the value head's
    (B, R, 1) (views); an FSDP2 root that returns a view warns that an in-place op on it would skip
    the root's gradient hook ("can produce wrong gradients"). No trainer changes them in place
    (tests/scale/test_fsdp2_gradients.py: the gradients equal the unsharded model's); a (B, R) copy
    of each keeps the hook on a tensor of its own, and the warning out."""
    return t.clone() if t is not None and t._is_view() else t


@contextlib.contextmanager
def _root_weights(model: nn.Module):
    """The root's own weights (embeddings, final norm, output layer) gathered for the block when FSDP2
    shards `model` (runtime/fsdp2.py `shard_frozen`): the reference runs its decoder and output layer
    itself, not through the root's forward; the layers gather their own weights in their forwards."""
    if not _sharded(model):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


def store_linear_weights(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Store the weights and biases of `model`'s linear layers in `dtype`, in place; embeddings,
    norms, buffers and the output layer keep theirs.

    Under autocast to `dtype` a linear layer rounds its fp32 weight and bias to `dtype` before the
    matmul exactly as `.to(dtype)` does, so these layers give the same bits either way. The other
    parts do not go through autocast: cast to bf16, the embeddings and norms would put the residual
    stream (fp32 in the policy under autocast) in bf16, and the fused output head computes in fp32
    from an fp32 weight (algos/head.py). A whole-model bf16 copy differed from the fp32 starting
    policy by up to 1.3e-3 in log-prob; this one is equal, in about the memory of the bf16 copy
    (linear layers hold most weights; SmolLM2-135M: 311 MiB against 257 MiB all-bf16, 513 MiB fp32).
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    keep = {id(p) for m in model.modules() if not isinstance(m, nn.Linear) for p in m.parameters(recurse=False)}
    keep |= {id(p) for p in head.parameters()} if head is not None else set()
    for module in model.modules():
        if isinstance(module, nn.Linear):
            for p in module.parameters(recurse=False):
                if id(p) not in keep:  # a weight shared with an embedding (tied) stays
                    p.data = p.data.to(dtype)
    return model


def save_actor(actor: ActorCritic, tokenizer, out_dir: str | Path, merge: bool = False,
               state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Save policy (adapter, or merged/full weights), tokenizer and value head (if any) in HF format.
    `state_dict` is the actor's full state dict when its live weights are sharded (FSDP, ZeRO-3:
    rlhfkit.runtime.distributed.full_state_dict); merging needs live weights."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    policy = actor.policy
    if merge and state_dict is not None:
        raise ValueError("merged weights cannot be saved from a sharded state dict; merge the saved adapter instead")
    if merge and hasattr(policy, "merge_and_unload"):
        policy = copy.deepcopy(policy).merge_and_unload()
    policy.save_pretrained(out, state_dict=_part(state_dict, "policy."))
    save_tokenizer(tokenizer, out)
    head = None
    if actor.value_head is not None:
        head = VALUE_HEAD_FILE
        weights = _part(state_dict, "value_head.") or actor.value_head.state_dict()
        save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, out / head)
    (out / "rlhfkit.json").write_text(json.dumps({"value_head": head, "merged": merge}, indent=2))
    return out


def _part(state: dict | None, prefix: str) -> dict | None:
    """Entries of a state dict under `prefix`, prefix removed (None stays None)."""
    return None if state is None else {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def load_value_head(path: str | Path, hidden_size: int) -> ValueHead:
    from safetensors.torch import load_file

    head = ValueHead(hidden_size)
    f = Path(path) / VALUE_HEAD_FILE
    if f.is_file():
        head.load_state_dict(load_file(f))
    return head
