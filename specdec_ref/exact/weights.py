"""The exact tables realised as ``LlamaForCausalLM`` weights and config, whose forward returns the table logits.

Invariant: every weight is a dyadic number with at most 8 significant bits (asserted by :func:`llama_weights`:
exact in float32 and bfloat16), RMS norms see a mean square of exactly 1, attention and MLP outputs are
exactly 0 (order1) or exactly one-hot attention (score gap >= :data:`MIN_SCORE_GAP`) and MLP gates exactly on
or off (order2), so the float32 forward of ``llama_config(model)`` / ``llama_weights(model)`` returns the
table logits of ``model`` bit for bit, with or without a KV cache. Deterministic: the same model always gives
the same arrays (the filler weights come from splitmix64, never from a random generator).
"""

from __future__ import annotations

import math

import numpy as np

from . import long as exact_long, offset as exact_offset
from .dyadic import MIN_SCORE_GAP, bf16_exact, dyadic_noise, four_squares, round_bits
from .registry import MAX_POSITIONS, ExactModel
from .tables import BOS_LOGIT, ORDER1_VOCAB, ORDER2_BOS, ORDER2_VOCAB, order2_cells

__all__ = ["MIN_SCORE_GAP", "llama_config", "llama_weights", "prev_head_scores"]

# Head size 32: the smallest head size that vLLM's CPU attention accepts (32, 64, 80, ... 512), so
# real engines can load the checkpoints; 2 heads (previous token and parity in order2).
_HEAD_DIM = 32
_NUM_HEADS = 2
# order2 rotary base: HF Llama's rotate_half pairs dims (i, i + 16), inv_freq_i = base ** (-2i / 32)
# = pi ** (i / 4), so pairs 0, 4, 8, 12 turn by 1, pi, pi^2, pi^3 per position (bitwise the same
# frequencies as head size 8 with the same base): pair 4 is the parity head's, the four together make
# a peaked kernel for the previous-token head; every other pair is zero in q (and k).
_PREV_HEAD_PAIRS = (0, 4, 8, 12)
_PARITY_PAIR = 4
_ORDER2_ROPE_THETA = math.pi**-4
_ORDER1_ROPE_THETA = 10000.0


def _order1_weights(table: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """order1: hidden 16. Token t embeds as 4 * e_t (mean square exactly 1); attention and MLP
    outputs are exactly 0 (o_proj, down_proj = 0); lm_head[v, t] = T[t, v] / 4."""
    v, hidden, inter = ORDER1_VOCAB, 16, 32
    qkv = _NUM_HEADS * _HEAD_DIM
    embed = np.zeros((v, hidden))
    embed[np.arange(v), np.arange(v)] = 4.0
    head = np.zeros((v, hidden))
    head[:, :v] = table.T / 4.0
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.input_layernorm.weight": np.ones(hidden),
        "model.layers.0.self_attn.q_proj.weight": dyadic_noise(seed + 1, (qkv, hidden)),
        "model.layers.0.self_attn.k_proj.weight": dyadic_noise(seed + 2, (qkv, hidden)),
        "model.layers.0.self_attn.v_proj.weight": dyadic_noise(seed + 3, (qkv, hidden)),
        "model.layers.0.self_attn.o_proj.weight": np.zeros((hidden, qkv)),
        "model.layers.0.post_attention_layernorm.weight": np.ones(hidden),
        "model.layers.0.mlp.gate_proj.weight": dyadic_noise(seed + 4, (inter, hidden)),
        "model.layers.0.mlp.up_proj.weight": dyadic_noise(seed + 5, (inter, hidden)),
        "model.layers.0.mlp.down_proj.weight": np.zeros((hidden, inter)),
        "model.norm.weight": np.ones(hidden),
        "lm_head.weight": head,
    }


# order2 residual stream (hidden 32), values before the layer (h0), after attention (h1), after the
# MLP (h2); the sum of squares is 32 at each stage, so every RMS norm divides by exactly 1.
_T0 = 0  # 0..7   one-hot of the last token b (1)
_A0 = 8  # 8..15  one-hot of the previous token a (0 in h0, 1 from the previous-token head)
_P = 16  # parity: -1 in h0, the parity head adds 2 at even positions -> +1 even / -1 odd
_C = 17  # constant 2 (source of the queries, the MLP biases and up-projection, the <bos> logit)
_S1 = 18  # slack 1 -> 0 after attention (pays for the one-hot of a)
_S2 = 19  # slack 5 -> 4 after the MLP (pays for logits + padding, whose squares sum to 9)
_L0 = 20  # 20..27 logits / 8 of the cell (column of <bos> unused)
_Q0 = 28  # 28..31 padding: 9 - sum(logits / 8)^2 as four squares (Lagrange)
_ORDER2_HIDDEN = 32
_GATE_ON = 32.0  # gate pre-activation of the unit of the current cell; every other unit is <= -112
_GATE_UNIT = 144.0
_PREV_HEAD_ALPHA = 16.0  # query of the previous-token head: (16, 0) on every rotary pair
# relative weight of the four rotary pairs in the previous-token kernel (a small linear program,
# max over weights of the smallest gap between delta = 1 and every other delta in [0, 127])
_PREV_HEAD_WEIGHTS = (0.16736578, 0.09514902, 0.20988754, 0.52759766)
_PREV_HEAD_PEAK = 1000.0  # scaled score at the previous position
_PARITY_Q = 32.0
_PARITY_K = 128.0  # scaled score 32 * 128 / sqrt(32) = 724 (64 at head size 8: the same score)


def _rope_angles(theta: float) -> np.ndarray:
    """Per-position angle of the previous-token head's pairs :data:`_PREV_HEAD_PAIRS`."""
    return np.array([theta ** (-2.0 * i / _HEAD_DIM) for i in _PREV_HEAD_PAIRS])


def _prev_head_qk() -> tuple[np.ndarray, np.ndarray]:
    """Pre-rotary query / key of the previous-token head, on rotary pairs (i, i + 16) for i in
    :data:`_PREV_HEAD_PAIRS`, zero elsewhere (the key scales with sqrt(head_dim): the same scores)."""
    angles = _rope_angles(_ORDER2_ROPE_THETA)
    scale, half = math.sqrt(_HEAD_DIM), _HEAD_DIM // 2
    q = np.zeros(_HEAD_DIM)
    k = np.zeros(_HEAD_DIM)
    for i, w, ang in zip(_PREV_HEAD_PAIRS, _PREV_HEAD_WEIGHTS, angles):
        beta = w * _PREV_HEAD_PEAK * scale / _PREV_HEAD_ALPHA
        q[i] = _PREV_HEAD_ALPHA
        # key rotated by +angle: score(m, j) ~ cos(angle * (1 + j - m)), peaked at j = m - 1
        k[i] = round_bits(beta * math.cos(ang) / 2.0) * 2.0
        k[i + half] = round_bits(beta * math.sin(ang) / 2.0) * 2.0
    return q, k


def prev_head_scores(max_positions: int = MAX_POSITIONS) -> np.ndarray:
    """float64 scaled scores of the previous-token head by ``delta = m - j`` in ``[0, max_positions)``,
    with exact rotation angles (what the checkpoint computes up to RoPE rounding)."""
    q, k = _prev_head_qk()
    angles = _rope_angles(_ORDER2_ROPE_THETA)
    out = np.zeros(max_positions)
    for delta in range(max_positions):
        s = 0.0
        for i, ang in zip(_PREV_HEAD_PAIRS, angles):
            phi = -delta * ang  # rotation of the key relative to the query: (j - m) * angle
            # q pair (q_i, 0) . R(phi) (k_i, k_{i+16})
            s += q[i] * (k[i] * math.cos(phi) - k[i + _HEAD_DIM // 2] * math.sin(phi))
        out[delta] = s / math.sqrt(_HEAD_DIM)
    return out


def _order2_weights(table: np.ndarray) -> dict[str, np.ndarray]:
    """order2: hidden 32, two heads (previous token, parity), one MLP unit per reachable cell."""
    v, hidden, d = ORDER2_VOCAB, _ORDER2_HIDDEN, _HEAD_DIM
    cells = order2_cells()
    qkv = _NUM_HEADS * d

    embed = np.zeros((v, hidden))
    embed[np.arange(v), _T0 + np.arange(v)] = 1.0
    embed[:, _P] = -1.0
    embed[:, _C] = 2.0
    embed[:, _S1] = 1.0
    embed[:, _S2] = 5.0

    q_proj = np.zeros((qkv, hidden))
    k_proj = np.zeros((qkv, hidden))
    v_proj = np.zeros((qkv, hidden))
    o_proj = np.zeros((hidden, qkv))
    # head 0: previous token. q, k constant (read from the constant channel, value 2); v = one-hot of
    # the token; o_proj writes the one-hot into the a channels and takes 1 from slack S1.
    q0, k0 = _prev_head_qk()
    q_proj[0:d, _C] = q0 / 2.0
    k_proj[0:d, _C] = k0 / 2.0
    for t in range(v):
        v_proj[t, _T0 + t] = 1.0
        o_proj[_A0 + t, t] = 1.0
        o_proj[_S1, t] = -1.0
    # head 1: parity. q = (PARITY_Q, 0) on rotary pair 4 (angle pi per position); only <bos> has a
    # key, (PARITY_K, 0): the score to <bos> at position 0 is +-PARITY_Q * PARITY_K / sqrt(32) by the
    # parity of the query position, every other key scores 0. v = 1 on <bos> only, so the head
    # outputs 1 at even positions and exactly 0 at odd ones; o_proj adds twice that to P.
    q_proj[d + _PARITY_PAIR, _C] = _PARITY_Q / 2.0
    k_proj[d + _PARITY_PAIR, _T0 + ORDER2_BOS] = _PARITY_K
    v_proj[d + 0, _T0 + ORDER2_BOS] = 1.0
    o_proj[_P, d + 0] = 2.0
    # token-dependent filler in the dims of head 1 that nothing reads (its query is exactly 0 outside
    # rotary pair 4 and o_proj ignores its value dims 1..31), so the cached K and V of every position
    # depend on the token there, as in a real model, without any effect on the output
    free_k = [i for i in range(d) if i not in (_PARITY_PAIR, _PARITY_PAIR + d // 2)]
    k_proj[[d + i for i in free_k], _T0 : _T0 + v] = dyadic_noise(11, (len(free_k), v))
    v_proj[d + 1 : 2 * d, _T0 : _T0 + v] = dyadic_noise(12, (d - 1, v))

    # MLP: unit n for cell (a, b, c): gate = 144 * (x_a + x_b + s_c * P) - 400 is 32 when the three
    # match and <= -112 otherwise; up = x_C / 2 = 1; down column = (cell's residual update) / 32.
    inter = len(cells)
    gate = np.zeros((inter, hidden))
    up = np.zeros((inter, hidden))
    down = np.zeros((hidden, inter))
    for n, (a, b, c) in enumerate(cells):
        gate[n, _A0 + a] = _GATE_UNIT
        gate[n, _T0 + b] = _GATE_UNIT
        gate[n, _P] = _GATE_UNIT if c == 0 else -_GATE_UNIT
        gate[n, _C] = (_GATE_ON - 3 * _GATE_UNIT) / 2.0
        up[n, _C] = 0.5
        logits = table[a, b, c]
        upd = np.zeros(hidden)
        sq = 0  # sum of squares of logits / 8, in units of 1/64^2
        for tok in range(v):
            if tok == ORDER2_BOS:
                continue
            e = int(round(logits[tok] * 8))  # eighths
            assert e == logits[tok] * 8 and -64 <= e <= 64
            upd[_L0 + tok] = e / 64.0
            sq += e * e
        pad = four_squares(9 * 64 * 64 - sq)
        for i, p in enumerate(pad):
            upd[_Q0 + i] = p / 64.0
        upd[_S2] = -1.0
        down[:, n] = upd / _GATE_ON

    head = np.zeros((v, hidden))
    for tok in range(v):
        if tok == ORDER2_BOS:
            head[tok, _C] = BOS_LOGIT / 2.0
        else:
            head[tok, _L0 + tok] = 8.0
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.input_layernorm.weight": np.ones(hidden),
        "model.layers.0.self_attn.q_proj.weight": q_proj,
        "model.layers.0.self_attn.k_proj.weight": k_proj,
        "model.layers.0.self_attn.v_proj.weight": v_proj,
        "model.layers.0.self_attn.o_proj.weight": o_proj,
        "model.layers.0.post_attention_layernorm.weight": np.ones(hidden),
        "model.layers.0.mlp.gate_proj.weight": gate,
        "model.layers.0.mlp.up_proj.weight": up,
        "model.layers.0.mlp.down_proj.weight": down,
        "model.norm.weight": np.ones(hidden),
        "lm_head.weight": head,
    }


def _check_prev_head_margin() -> float:
    scores = prev_head_scores()
    others = np.delete(scores, 1)
    gap = float(scores[1] - others.max())
    assert gap >= MIN_SCORE_GAP, f"previous-token head margin {gap} < {MIN_SCORE_GAP}"
    parity = _PARITY_Q * _PARITY_K / math.sqrt(_HEAD_DIM)
    assert parity >= MIN_SCORE_GAP
    return gap


def llama_config(model: ExactModel) -> dict:
    """The ``config.json`` of ``model``'s checkpoint (a 1-layer ``LlamaForCausalLM``)."""
    o2 = model.family == "order2"
    dims = {"hidden_size": _ORDER2_HIDDEN if o2 else 16, "intermediate_size": len(order2_cells()) if o2 else 32,
            "num_attention_heads": _NUM_HEADS, "num_key_value_heads": _NUM_HEADS, "head_dim": _HEAD_DIM,
            "rope_theta": _ORDER2_ROPE_THETA if o2 else _ORDER1_ROPE_THETA}
    if model.family == "long":
        dims = exact_long.long_dims(model.name)
    theta = dims["rope_theta"]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": model.vocab,
        "hidden_size": dims["hidden_size"],
        "intermediate_size": dims["intermediate_size"],
        "num_hidden_layers": 1,
        "num_attention_heads": dims["num_attention_heads"],
        "num_key_value_heads": dims["num_key_value_heads"],
        "head_dim": dims["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": model.max_positions,
        "rms_norm_eps": 0.0,
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": model.bos_id,
        "eos_token_id": model.eos_id,
        "pad_token_id": model.eos_id,
        "dtype": "float32",
        "torch_dtype": "float32",
    }


def llama_weights(model: ExactModel) -> dict[str, np.ndarray]:
    """The float64 weights of ``model``'s checkpoint by parameter name (asserted exact in float32 and bfloat16)."""
    if model.family == "order1" and model.logit_offset:
        table = model.table - model.logit_offset  # exact: the base table
        weights = exact_offset.offset_order1_weights(_order1_weights(table, seed=1000), table, model.logit_offset)
    elif model.family == "order1":
        weights = _order1_weights(model.table, seed=1000)
    elif model.family == "long":
        weights = exact_long.long_weights(model.name, model.table)
    else:
        _check_prev_head_margin()
        weights = _order2_weights(model.table)
    for name, w in weights.items():
        assert np.all(np.isfinite(w)), name
        assert np.array_equal(w.astype(np.float32).astype(np.float64), w), f"{model.name}: {name} not exact in float32"
        assert bf16_exact(w), f"{model.name}: {name} not exact in bfloat16"
    return weights

