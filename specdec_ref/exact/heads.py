"""Exactly-known proposer heads on the order-1 targets: their proposals are small tables of what they read.

The order-1 targets (:mod:`specdec_ref.exact`) have hidden size 16 and a final hidden state ``4 e_t`` at a
position holding token ``t`` (before and after the final norm: its mean square is exactly 1), and their lm_head maps
``4 e_t`` to the table row ``T[t]``. A head built here reads those features through dyadic weights, so its float32
logits are the table expressions below bit for bit (and :mod:`specdec_properties.proposals` computes them in float64 from
the tables alone):

* :func:`exact_eagle_head`: ``fc`` maps ``[4 e_x, f]`` to ``h = alpha 4 e_x + C^T f`` (``C`` = :func:`eagle_mix`: row
  ``y`` the target's law after ``y`` in eighths) and the decoder layer's outputs are exactly zero (``o_proj``,
  ``down_proj`` = 0), so with the target's lm_head (``T^T / 4``) the first draft after the pending ``x``, whose
  predecessor ``y`` gave the feature ``4 e_y``, has logits ``alpha T[x] + sum_t C[y, t] T[t]``: half the pending
  token's row plus the feature's guess of it. Step ``i`` chains on the head's own feature,
  ``h_i = alpha 4 e_d_i-1 + C^T h_i-1``. The feature is informative (the token before the pending one predicts it),
  so a feature of the wrong position costs acceptance on average, not only per round: ``tests/test_proposers.py``
  states by how much.
* :func:`exact_medusa_heads`: residual blocks exactly zero, head ``i``'s lm_head is ``M_i``, the log of the target's
  ``i + 2``-step transition law rounded to eighths: from the feature of ``y`` (the token before the pending one) head
  ``i`` proposes ``argmax M_i[y]``, the likeliest token ``i + 2`` places after ``y``. A head read at the wrong offset
  proposes another step's token.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from ..heads import Eagle3Head, EagleHead, MedusaHeads, MtpHead

__all__ = ["EAGLE_ALPHA", "EAGLE3_AUX", "EAGLE3_WEIGHTS", "EAGLE3_VOCAB", "eagle_mix", "exact_eagle_head",
           "exact_eagle3_head", "exact_mtp_head", "exact_medusa_heads", "medusa_table", "order1_table"]

#: EAGLE head's weight on the token's own row (dyadic: products stay exact in float32).
EAGLE_ALPHA = 0.5
_HIDDEN = 16
_VOCAB = 8


def order1_table(target_name: str) -> np.ndarray:
    """``T [8, 8]`` float64: row ``a`` is the order-1 target's logits after token ``a``."""
    from . import exact_model

    m = exact_model(target_name)
    if m.family != "order1" or getattr(m, "logit_offset", 0):
        raise ValueError(f"exact heads are built on the plain order-1 targets, not {target_name}")
    return np.asarray(m.next_logits([[a] for a in range(m.vocab)]), dtype=np.float64)


def _zero_layer_model(target):
    """A one-layer Llama of the target's shape whose layer outputs are exactly zero (the head's decoder layer: its
    attention and MLP run, their K/V fill the head's cache, and they add nothing)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{k: v for k, v in target.config.to_dict().items() if k in (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
        "max_position_embeddings", "rms_norm_eps", "rope_theta")})
    cfg.num_hidden_layers = 1
    cfg.tie_word_embeddings = False
    # a positive eps (the outputs stay exactly zero whatever it is): the catch-up pads shorter rows, and an MTP
    # module's padding at a masked position 0 is a zero vector, whose RMSNorm at eps 0 is NaN; a NaN left in a
    # masked slot of the head's cache still multiplies its zero attention weight
    cfg.rms_norm_eps = 2.0**-40
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    param = next(target.parameters())
    return model.to(device=param.device, dtype=param.dtype)


@functools.lru_cache(maxsize=None)
def eagle_mix(target_name: str) -> np.ndarray:
    """``C [8, 8]``: row ``y`` is the target's untempered law after ``y`` rounded to eighths, the weights with which the
    EAGLE head mixes the target's rows for the feature of ``y`` (its guess of the next row before reading the token)."""
    t = order1_table(target_name)
    p = np.exp(t - t.max(1, keepdims=True))
    return np.round(p / p.sum(1, keepdims=True) * 8) / 8


def _eagle_fc(target, target_name: str, alpha: float) -> torch.Tensor:
    """``fc [H, 2H] = [alpha I | E^T C^T E / |E_t|^2]``, in the target's dtype, on its device: on a target whose
    token embeddings ``E [V, H]`` are orthogonal rows of one squared norm and whose final feature at a position holding
    ``t`` is ``E[t]`` (the order-1 checkpoints: ``4 e_t``, where this is ``[alpha I | C^T]`` on dims 0..7; the wide
    exact targets of :mod:`specdec_ref.exact.wide`), ``h = alpha E[x] + sum_t C[y, t] E[t]`` for the feature of ``y``.
    Dyadic throughout, so the logits are the table expressions bit for bit on the order-1 targets."""
    embed = target.get_input_embeddings().weight.detach().double().cpu()
    gram = embed @ embed.T
    norm2 = float(gram[0, 0])
    if embed.shape[0] != _VOCAB or not torch.equal(gram, norm2 * torch.eye(_VOCAB, dtype=torch.float64)):
        raise ValueError(f"exact heads expect an order-1 target (orthogonal token embeddings of one norm, V={_VOCAB}), "
                         f"got embeddings {list(embed.shape)}")
    hidden = embed.shape[1]
    mix = torch.from_numpy(eagle_mix(target_name).T)
    fc = torch.zeros(hidden, 2 * hidden, dtype=torch.float64)
    fc[:, :hidden] = alpha * torch.eye(hidden, dtype=torch.float64)
    fc[:, hidden:] = embed.T @ mix @ embed / norm2
    param = next(target.parameters())
    return fc.to(device=param.device, dtype=param.dtype)


def _final_is_embedding(target) -> None:
    if getattr(target.config, "exact_deep", None):
        raise ValueError("the deep target's final feature is not its token embedding (its layers move the one-hot): "
                         "EAGLE and MTP heads are exact on the order-1 targets; the deep target is EAGLE-3's")


def exact_eagle_head(target, target_name: str, *, alpha: float = EAGLE_ALPHA, sample: bool = True,
                     layer: bool = True) -> EagleHead:
    """The exact EAGLE head on an order-1 target model (module docstring), on its device and in its dtype;
    ``layer=False``: no decoder layer."""
    _final_is_embedding(target)
    fc = _eagle_fc(target, target_name, alpha)
    head = EagleHead(fc=fc, layers=_zero_layer_model(target) if layer else None, sample=sample, name="exact-eagle")
    head.table_spec = ("eagle", target_name, alpha)
    return head


#: The exact EAGLE-3 head's auxiliary layers (vLLM's default ``(2, N // 2, N - 3)`` for the 3-layer deep target, in
#: ascending order), the weight of each in the fused feature, and its draft vocabulary (target ids, ascending).
EAGLE3_AUX = (0, 1, 2)
EAGLE3_WEIGHTS = (0.5, 0.25, 0.25)
EAGLE3_VOCAB = (0, 1, 2, 3, 5, 7)


def exact_eagle3_head(target, target_name: str, *, alpha: float = EAGLE_ALPHA, sample: bool = False,
                      layer: bool = True, vocab: tuple = EAGLE3_VOCAB) -> Eagle3Head:
    """The exact EAGLE-3 head on the deep target of ``target_name``'s table (:func:`specdec_ref.exact.deep.deep_target`,
    on its device and in its dtype): ``fuse`` reads aux layer ``a_j``'s one-hot ``4 e_c`` (``c = deep_channel(y,
    a_j)``) back to ``y`` with weight ``EAGLE3_WEIGHTS[j]``, so the fused feature is ``4 e_y``, that of the EAGLE head,
    exactly when every layer is the right one (a wrong layer adds a third or more of another token's feature); then
    the EAGLE head's ``fc`` and zeroed layer; its own lm_head scores the draft vocabulary ``vocab`` (``d2t[d] =
    vocab[d] - d``) with the table's columns."""
    from .deep import deep_channel

    deep = getattr(target.config, "exact_deep", None)
    if deep is None or deep[0] != target_name or deep[1] < max(EAGLE3_AUX) + 1:
        raise ValueError(f"the exact EAGLE-3 head reads the deep target of {target_name} with at least "
                         f"{max(EAGLE3_AUX) + 1} layers (specdec_ref.exact.deep.deep_target), got {deep}")
    fc = _eagle_fc(target, target_name, alpha)
    dtype, device = fc.dtype, fc.device
    fuse = torch.zeros(_HIDDEN, len(EAGLE3_AUX) * _HIDDEN, dtype=dtype)
    for j, (aux, w) in enumerate(zip(EAGLE3_AUX, EAGLE3_WEIGHTS)):
        for y in range(_VOCAB):
            fuse[y, j * _HIDDEN + deep_channel(y, aux)] = w
    table = order1_table(target_name)
    lm_head = torch.zeros(len(vocab), _HIDDEN, dtype=dtype)
    lm_head[:, :_VOCAB] = torch.from_numpy(table[:, list(vocab)].T / 4).to(dtype)
    d2t = torch.tensor([t - d for d, t in enumerate(vocab)], dtype=torch.long)
    head = Eagle3Head(fc=fc, fuse=fuse.to(device), aux_layers=EAGLE3_AUX, lm_head=lm_head.to(device), d2t=d2t.to(device),
                      layers=_zero_layer_model(target) if layer else None, sample=sample, name="exact-eagle3")
    head.table_spec = ("eagle3", target_name, alpha, tuple(vocab))
    return head


def exact_mtp_head(target, target_name: str, *, alpha: float = EAGLE_ALPHA, sample: bool = False,
                   layer: bool = True) -> MtpHead:
    """The exact MTP module on an order-1 target model: the EAGLE head's ``fc`` between the norms (weights one, eps
    0: the inputs ``4 e_x`` and ``4 e_y`` pass unchanged) and the zeroed layer, then the output norm, which rescales
    the mixture to a mean square of 1 (not exact in float32: ``specdec_properties.proposals.MtpLaw`` states the law in float64
    and its tie margin). The token embedding at position 0 is zeroed (the first draft of a two-token prompt reads the
    feature alone)."""
    _final_is_embedding(target)
    fc = _eagle_fc(target, target_name, alpha)
    head = MtpHead(fc=fc, layers=_zero_layer_model(target) if layer else None, sample=sample, name="exact-mtp")
    head.table_spec = ("mtp", target_name, alpha)
    return head


@functools.lru_cache(maxsize=None)
def medusa_table(target_name: str, offset: int) -> np.ndarray:
    """``M [8, 8]``: row ``y`` is the log of the target's untempered ``offset``-step law from ``y``, in eighths within
    [-8, 8] (exact in float32 and bfloat16)."""
    t = order1_table(target_name)
    p = np.exp(t - t.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    law = np.linalg.matrix_power(p, offset)
    return np.clip(np.round(np.log(np.maximum(law, 1e-300)) * 8) / 8, -8, 8)


def exact_medusa_heads(target, target_name: str, heads: int = 3, *, sample: bool = False) -> MedusaHeads:
    """The exact Medusa heads on an order-1 target model (module docstring): head ``i`` holds
    :func:`medusa_table` at offset ``i + 2``."""
    dtype, device = next(target.parameters()).dtype, next(target.parameters()).device
    lm_heads = []
    for i in range(heads):
        w = torch.zeros(_VOCAB, _HIDDEN, dtype=dtype)
        w[:, :_VOCAB] = torch.from_numpy(medusa_table(target_name, i + 2).T / 4).to(dtype)
        lm_heads.append(w.to(device))
    zero = (torch.zeros(_HIDDEN, _HIDDEN, dtype=dtype, device=device), torch.zeros(_HIDDEN, dtype=dtype, device=device))
    spec = MedusaHeads(blocks=[[zero] for _ in range(heads)], lm_heads=lm_heads, sample=sample, name="exact-medusa")
    spec.table_spec = ("medusa", target_name, heads)
    return spec
