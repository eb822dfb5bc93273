"""A deep exactly-known target: an order-1 table realised by a Llama of several layers whose residual streams differ.

The shipped order-1 checkpoints have one layer whose outputs are zero, so every hidden state of a position holding
``t`` is the same ``4 e_t``: a head reading the wrong layer would read the right thing. :func:`deep_target` builds
(in memory, from the table; nothing is shipped) a Llama with ``layers`` decoder layers where layer ``l``'s MLP moves
the one-hot one step along the cycle ``s -> s + SHIFT (mod 8)``:

* the residual stream entering layer ``l`` (EAGLE-3's auxiliary layer id ``l``; ``0`` the token embeddings, ``layers``
  the last layer's output) at a position holding ``t`` is exactly ``4 e_c`` with ``c = deep_channel(t, l)``;
* the final norm sees a mean square of 1 (weight 1, eps 0) and the lm_head reads channel ``deep_channel(t, layers)``
  with the table row ``T[t] / 4``, so the logits are the order-1 table bit for bit, with or without a KV cache.

Exactness, layer by layer: attention outputs are exactly 0 (``o_proj`` = 0, as in the order-1 checkpoints); the MLP
has one unit per channel ``u`` in 0..7 whose gate reads ``4 e_s`` as ``32`` when ``s == u`` (SiLU(32) == 32 in float32
and bfloat16) and ``-112`` otherwise (SiLU == -0), its up projection is exactly 1, and its down projection writes
``(e_sigma(u) - e_u) / 8``: the stream goes from ``4 e_s`` to ``4 e_sigma(s)`` with no rounding. Every weight is a
dyadic number exact in bfloat16.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

__all__ = ["SHIFT", "deep_channel", "deep_config", "deep_target", "deep_weights"]

#: The cycle each layer moves the one-hot along (coprime with 8: every layer's stream differs from the others').
SHIFT = 3
_VOCAB, _HIDDEN, _INTER = 8, 16, 32


def deep_channel(token: int, layer: int) -> int:
    """The channel of the one-hot ``4 e_c`` entering layer ``layer`` at a position holding ``token``."""
    return (token + SHIFT * layer) % _VOCAB


def _weights(table: np.ndarray, base: dict, layers: int) -> dict:
    w = {"model.embed_tokens.weight": base["model.embed_tokens.weight"], "model.norm.weight": np.ones(_HIDDEN)}
    gate, up, down = np.zeros((_INTER, _HIDDEN)), np.zeros((_INTER, _HIDDEN)), np.zeros((_HIDDEN, _INTER))
    for u in range(_VOCAB):
        gate[u, :_VOCAB] = -28.0
        gate[u, u] = 8.0
        up[u, :_VOCAB] = 0.25
        down[(u + SHIFT) % _VOCAB, u] = 0.125
        down[u, u] = -0.125
    for layer in range(layers):
        pre = f"model.layers.{layer}."
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                     "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight"):
            w[pre + name] = base["model.layers.0." + name]
        w[pre + "mlp.gate_proj.weight"], w[pre + "mlp.up_proj.weight"], w[pre + "mlp.down_proj.weight"] = gate, up, down
    head = np.zeros((_VOCAB, _HIDDEN))
    for t in range(_VOCAB):
        head[:, deep_channel(t, layers)] = table[t] / 4.0
    w["lm_head.weight"] = head
    return w


def _order1(target_name: str):
    from .registry import exact_model

    m = exact_model(target_name)
    if m.family != "order1" or getattr(m, "logit_offset", 0):
        raise ValueError(f"the deep target is built on a plain order-1 table, not {target_name}")
    return m


def _check_layers(layers) -> None:
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"layers must be an int >= 1, got {layers!r}")


def deep_config(target_name: str = "order1-target", layers: int = 3) -> dict:
    """The deep target's Llama configuration (that of ``target_name``'s checkpoint with ``layers`` decoder layers)."""
    from .weights import llama_config

    _check_layers(layers)
    return dict(llama_config(_order1(target_name)), num_hidden_layers=layers)


def deep_weights(target_name: str = "order1-target", layers: int = 3) -> dict[str, np.ndarray]:
    """The deep target's weights by parameter name, float64 (every one exact in float32 and bfloat16): what
    :func:`deep_target` loads, and what :func:`specdec_ref.exact.head_files.deep_target_folder` writes for engines."""
    from .weights import llama_weights

    _check_layers(layers)
    m = _order1(target_name)
    return _weights(np.asarray(m.table, dtype=np.float64), llama_weights(m), layers)


@functools.lru_cache(maxsize=None)
def _deep(target_name: str, layers: int, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**deep_config(target_name, layers))).eval()
    weights = deep_weights(target_name, layers)
    state = {name: torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)) for name, value in weights.items()}
    model.load_state_dict(state, strict=True)
    model.requires_grad_(False)
    model.config.exact_deep = (target_name, layers)
    return model.to(dtype)


def deep_target(target_name: str = "order1-target", layers: int = 3, dtype: torch.dtype = torch.float32):
    """The deep target of ``target_name``'s table (module docstring), ``layers`` >= 1 decoder layers, in ``dtype``
    (the same object per arguments: treat it as read-only)."""
    _check_layers(layers)
    return _deep(target_name, layers, dtype)
