"""An exactly-known order-1 table realised in a model of any width and depth, built at run time.

Why: on a CPU the shipped pairs are so small that a target forward costs little more than a draft
forward, so speculation never pays there. A profile should show both sides, so this module builds a
*deliberately expensive* target whose law is still an exact table (:mod:`specdec_ref.exact`'
``order1`` family: ``logits = T[last token]``), and a cheap draft with another exact table. The
acceptance of the pair is therefore known exactly (``sum_x min(p, q)`` per row), whatever the size.

Construction (a ``LlamaForCausalLM``, float32, deterministic from ``seed``):

* token ``t`` embeds as the value ``a`` on the ``m`` dims ``t m .. t m + m - 1`` with ``a`` a power of two
  and ``m a^2 = hidden``: the mean square is exactly 1, so every RMS norm (``rms_norm_eps = 0``) divides
  by exactly 1 and returns its input unchanged;
* every layer's q/k/v, gate and up projections are dense seeded Gaussians (real work: attention over
  the whole KV cache, the full MLP), while ``o_proj`` and ``down_proj`` are exactly zero, so each
  layer adds exactly 0 to the residual stream (finite values times 0);
* ``lm_head[v, t m] = T[t, v] / a`` (dyadic: the table holds eighths), so the logits are the table
  bit for bit in float32 (tested against :meth:`ExactModel.next_logits`).

Cost grows with ``hidden``, ``intermediate``, ``layers`` and the context (attention reads the cache),
the law never changes: the order1 law does not depend on position, so ``max_positions`` is free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from . import EXACT_MODELS, ExactModel

__all__ = ["WideSpec", "WIDE_TARGET", "NARROW_DRAFT", "build_wide_exact", "wide_exact_pair"]


@dataclass(frozen=True)
class WideSpec:
    """Shape of a built model: ``hidden`` must be ``m a^2`` with ``a`` a power of two and ``m * V <= hidden``."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    max_positions: int = 4096


#: The default expensive target: ~34 M parameters (about 134 MB in float32).
WIDE_TARGET = WideSpec(hidden=512, intermediate=2048, layers=8, heads=8)
#: The default cheap draft: one small layer.
NARROW_DRAFT = WideSpec(hidden=64, intermediate=128, layers=1, heads=2)


def _embed_scale(hidden: int, vocab: int) -> tuple[float, int]:
    """``(a, m)``: ``a`` the largest power of two with ``a^2 | hidden`` and ``m = hidden / a^2 >= 1`` dims per token."""
    a = 1
    while hidden % ((2 * a) ** 2) == 0:
        a *= 2
    m = hidden // (a * a)
    if m * vocab > hidden:
        raise ValueError(f"hidden {hidden} leaves no room for {vocab} one-hot tokens of {m} dims each")
    return float(a), m


def build_wide_exact(model: ExactModel | str, spec: WideSpec, *, seed: int = 0) -> LlamaForCausalLM:
    """``model``'s order-1 law in a Llama of shape ``spec`` (module docstring); eval mode, no gradients."""
    exact = EXACT_MODELS[model] if isinstance(model, str) else model
    if exact.family != "order1" or exact.logit_offset:
        raise ValueError(f"{exact.name}: only the plain order1 tables can be widened, got family {exact.family}")
    if spec.hidden % spec.heads:
        raise ValueError(f"hidden {spec.hidden} is not a multiple of heads {spec.heads}")
    vocab, table = exact.vocab, torch.from_numpy(exact.table.copy())
    a, m = _embed_scale(spec.hidden, vocab)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.heads, head_dim=spec.hidden // spec.heads,
        max_position_embeddings=spec.max_positions, rms_norm_eps=0.0, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, bos_token_id=None, eos_token_id=exact.eos_id, pad_token_id=exact.eos_id,
    )
    config._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        net = LlamaForCausalLM(config).eval()
        embed = torch.zeros(vocab, spec.hidden)
        head = torch.zeros(vocab, spec.hidden)
        for t in range(vocab):
            embed[t, t * m : (t + 1) * m] = a
            head[:, t * m] = table[t] / a
        net.model.embed_tokens.weight.copy_(embed)
        net.lm_head.weight.copy_(head)
        std = 1.0 / math.sqrt(spec.hidden)
        for layer in net.model.layers:
            for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.mlp.gate_proj, layer.mlp.up_proj):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) * std)
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        net.model.norm.weight.fill_(1.0)
    for p in net.parameters():
        p.requires_grad_(False)
    return net


def wide_exact_pair(
    target_spec: WideSpec = WIDE_TARGET, draft_spec: WideSpec = NARROW_DRAFT, *, target: str = "order1-target",
    draft: str = "order1-draft-close", seed: int = 0,
) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """``(target, draft)``: ``target``'s table in a wide model, ``draft``'s in a narrow one (same vocabulary)."""
    return build_wide_exact(target, target_spec, seed=seed), build_wide_exact(draft, draft_spec, seed=seed + 1)
