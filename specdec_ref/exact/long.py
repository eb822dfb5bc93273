"""The long-context exactly-known family: 4 096 positions, a law that reads a marker token anywhere behind.

The law (``long-target``, ``long-draft``): a context is ``[<bos>, x_1, .., x_m]`` (``<bos>`` at position 0 only)
holding at most one *marker* token (``m0 .. m3``, ids 8..11) that is not among its last two tokens; the logits
after it are ``T[a, b, c, k]`` with ``b = x_m``, ``a = x_{m-1}`` (``<bos>`` when ``m = 1``; ``a = b = <bos>`` for
``[<bos>]``), ``c = m % 2`` and ``k`` the marker's index (4: no marker), wherever the marker stands. A KV entry lost,
stale or moved at the marker's position, at the previous position or at ``<bos>`` changes the law; the marker and
``<bos>`` logits are :data:`~specdec_ref.exact.tables.BOS_LOGIT` (never generated).

The checkpoint (``LlamaForCausalLM``, one layer, hidden 64, 4 query heads on 2 KV heads, head size 128 for the target
and 64 for the draft): every weight is a dyadic number of at most 8 significant bits and every RMS norm sees a mean
square of exactly 1, as in order2 (:mod:`specdec_ref.exact.weights`). Rotary pair ``i < 32`` turns by ``pi^(i / 16)``
per position (``rope_theta = pi^-4`` at head size 128, ``pi^-2`` at 64), so pair 16 turns by ``pi``.

* KV head 0, query head 0 (previous token): constant query and key on the 31 pairs other than 16, the key turned by
  one position, weights from a linear program: a kernel over ``m - j`` in ``[0, 4096)`` peaked at 1 whose gap to
  every other offset is at least :data:`~specdec_ref.exact.weights.MIN_SCORE_GAP`; the value is the token's
  one-hot, written into the previous-token channels.
* KV head 0, query head 1 (parity): pair 16 against a key that only ``<bos>`` has: ``+-`` a large score by the
  parity of the query's position, every other key exactly 0; the head outputs 1 at even positions, 0 at odd ones.
* KV head 1, query heads 2 and 3 (the marker): pair 16 against a key only markers have, with opposite queries: the
  score is ``+-`` large by the parity of ``m - j``, so exactly one of the two heads attends to the marker (weight 1)
  and the other sees keys scoring 0 whose values are 0 in the marker dims; together they write the marker's
  one-hot (and remove the "no marker" flag).
* MLP: one unit per reachable cell ``(a, b, c, k)``, gate 32 exactly when the four match, ``<= -112`` otherwise.
"""

from __future__ import annotations

import math

import numpy as np

from .dyadic import MIN_SCORE_GAP, dyadic_noise, four_squares, round_bits
from .tables import BOS_LOGIT, bell_ints, unique_max_

__all__ = [
    "LONG_VOCAB",
    "LONG_BOS",
    "LONG_EOS",
    "LONG_REAL",
    "LONG_MARKERS",
    "NO_MARKER",
    "LONG_MAX_POSITIONS",
    "LONG_SHAPES",
    "long_cells",
    "long_tables",
    "long_cell",
    "long_cell_at",
    "long_dims",
    "long_weights",
    "long_prev_scores",
    "long_token_names",
    "validate_long_context",
]

LONG_VOCAB = 12
LONG_BOS = 6
LONG_EOS = 7
#: the tokens a law can generate (and that ``a`` and ``b`` range over past ``<bos>``)
LONG_REAL = (0, 1, 2, 3, 4, 5, 7)
LONG_MARKERS = (8, 9, 10, 11)
#: the marker index of a context without a marker
NO_MARKER = 4
LONG_MAX_POSITIONS = 4096
#: head size and rotary base of each model: the same per-position angles on pairs 0..31 at both sizes
LONG_SHAPES = {"long-target": (128, math.pi**-4), "long-draft": (64, math.pi**-2)}

_HIDDEN = 64
_HEADS, _KV_HEADS = 4, 2
_PI_PAIR = 16
_KERNEL_PAIRS = tuple(i for i in range(32) if i != _PI_PAIR)
# kernel weights of the 31 pairs (a linear program: max over w >= 0, sum w = 1, of the smallest
# sum_i w_i (1 - cos(f_i d)) over d = delta - 1 for delta in [0, 4096) other than 1; optimum 0.676)
_KERNEL_WEIGHTS = (
    0.06054912, 0.00942638, 0.01696147, 0.02993863, 0.0275842, 0.02396153, 0.0374875, 0.02227106,
    0.03818173, 0.05647619, 0.01649742, 0.04425375, 0.04232448, 0.03445147, 0.02116947, 0.04268887,
    0.04826438, 0.03414872, 0.00877689, 0.02890153, 0.04041231, 0.05471575, 0.03811024, 0.03318279,
    0.0304076, 0.0307982, 0.02932571, 0.0200591, 0.02116281, 0.02053713, 0.03697356,
)
_KERNEL_ALPHA = 16.0  # query of the previous-token head on every kernel pair
_KERNEL_PEAK = 1000.0  # scaled score at the previous position
_PI_SCORE = 4096.0  # query x key on pair 16 for the parity and marker heads (scaled: 4096 / sqrt(head size))

# residual channels (hidden 64); the sum of squares is 64 before the layer, after attention and after the MLP
_TOK = 0  # 0..11 one-hot of the token at this position (b)
_PREV = 12  # 12..19 one-hot of the previous token a (ids 0..7), from the previous-token head
_MARK = 20  # 20..23 one-hot of the marker index, from the marker heads
_NONE = 24  # 1 without a marker, 0 with one
_P = 25  # parity: -1, + 2 at even positions
_C = 26  # constant 2
_S1 = 27  # slack 1 -> 0 when the previous token is written
_S2 = 28  # slack 5 -> 4 after the MLP (pays for the logits and padding: squares summing to 9)
_L = 29  # 29..36 logits / 8 of ids 0..7 (the <bos> column unused)
_Q = 37  # 37..40 padding: 9 - sum((logits / 8)^2) as four squares
_FILL = (41, 42, 43, 44)  # constant slack 5, 2, 1, 1: the squares sum to 64
_FILL_VALUES = (5.0, 2.0, 1.0, 1.0)
_GATE_ON, _GATE_UNIT = 32.0, 144.0


def long_token_names() -> list[str]:
    return [f"t{i}" for i in range(6)] + ["<bos>", "<eos>"] + [f"m{i}" for i in range(4)]


def long_cells() -> tuple[tuple[int, int, int, int], ...]:
    """Every reachable ``(a, b, c, k)`` cell, in a fixed order (the order of the MLP units)."""
    bos = LONG_BOS
    cells = [(bos, bos, 0, NO_MARKER)] + [(bos, b, 1, NO_MARKER) for b in LONG_REAL]
    cells += [(a, b, c, k) for k in range(NO_MARKER + 1) for a in LONG_REAL for b in LONG_REAL for c in (0, 1)]
    return tuple(cells)


def validate_long_context(name: str, ctx: list[int]) -> None:
    """ValueError unless ``ctx`` is a context of the long family (``<bos>`` first and only there is checked by the
    caller): at most one marker, not among the last two tokens."""
    marks = [i for i, t in enumerate(ctx) if t in LONG_MARKERS]
    if len(marks) > 1:
        raise ValueError(f"{name}: a context holds at most one marker (m0..m3), got {len(marks)} at positions {marks}")
    if marks and marks[0] > len(ctx) - 3:
        raise ValueError(f"{name}: a marker must stand at least two positions before the last token; got it at "
                         f"position {marks[0]} of a context of {len(ctx)}")


def long_cell(ctx: list[int]) -> tuple[int, int, int, int]:
    """The cell of a valid context (:func:`validate_long_context`)."""
    k = next((t - LONG_MARKERS[0] for t in ctx if t in LONG_MARKERS), NO_MARKER)
    return long_cell_at(ctx, len(ctx) - 1, k)


def long_cell_at(seq: list[int], m: int, k: int) -> tuple[int, int, int, int]:
    """The cell of the context ``seq[:m + 1]`` whose marker index is ``k`` (read once per sequence)."""
    return (seq[m - 1] if m >= 1 else seq[0], seq[m], m % 2, k)


def _unique_rows(table: np.ndarray) -> np.ndarray:
    for a, b, c, k in long_cells():
        unique_max_(table[a, b, c, k], LONG_REAL)
    return table


def _target_eighths() -> np.ndarray:
    """T in eighths, int64 ``[a, b, c, k, v]`` over ids 0..7 for a, b (<bos> only where reachable)."""
    n, v = 8, LONG_VOCAB
    base = bell_ints(21, (n, v), 9)  # by last token b
    inter = bell_ints(22, (n, n, v), 4)  # by (a, b)
    parity = bell_ints(23, (n, v), 4)  # by b, sign flips with c
    marker = bell_ints(24, (NO_MARKER + 1, n, v), 8)  # by (k, b): the far token matters as much as the last
    table = base[None, :, None, None, :] + inter[:, :, None, None, :]
    table = table + np.stack([-parity, parity], axis=1)[None, :, :, None, :]
    table = table + marker.transpose(1, 0, 2)[None, :, None, :, :]
    table[..., LONG_EOS] -= 12  # EOS rarer than in order2: completions run longer
    return _unique_rows(np.clip(table, -64, 64))


def _table(eighths: np.ndarray) -> np.ndarray:
    table = eighths.astype(np.float64) / 8.0
    table[..., LONG_BOS] = BOS_LOGIT
    table[..., list(LONG_MARKERS)] = BOS_LOGIT
    table.setflags(write=False)
    return table


def long_tables() -> dict[str, np.ndarray]:
    """float64 logit tables ``[8, 8, 2, 5, 12]`` (cell ``(a, b, c, k)``) of ``long-target`` and ``long-draft`` (the
    target plus bell-shaped noise of spread 2 eighths: close, reading the marker too)."""
    t = _target_eighths()
    d = _unique_rows(np.clip(t + bell_ints(27, t.shape, 2), -64, 64))
    return {"long-target": _table(t), "long-draft": _table(d)}


# --------------------------------------------------------------------------- checkpoint


def _frequencies() -> np.ndarray:
    return np.array([math.pi ** (i / 16.0) for i in _KERNEL_PAIRS])


def _kernel_qk(head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Query and key of the previous-token head (before RoPE) on pairs (i, i + head_dim / 2)."""
    half, scale = head_dim // 2, math.sqrt(head_dim)
    q, k = np.zeros(head_dim), np.zeros(head_dim)
    for i, w, f in zip(_KERNEL_PAIRS, _KERNEL_WEIGHTS, _frequencies()):
        beta = w * _KERNEL_PEAK * scale / _KERNEL_ALPHA
        q[i] = _KERNEL_ALPHA
        k[i] = round_bits(beta * math.cos(f) / 2.0) * 2.0
        k[i + half] = round_bits(beta * math.sin(f) / 2.0) * 2.0
    return q, k


def long_prev_scores(head_dim: int, max_positions: int = LONG_MAX_POSITIONS) -> np.ndarray:
    """float64 scaled scores of the previous-token head by ``delta = m - j`` in ``[0, max_positions)`` with exact
    angles (what the checkpoint computes up to RoPE's rounding)."""
    q, k = _kernel_qk(head_dim)
    half = head_dim // 2
    delta = np.arange(max_positions, dtype=np.float64)
    out = np.zeros(max_positions)
    for i, f in zip(_KERNEL_PAIRS, _frequencies()):
        phi = -delta * f
        out += q[i] * (k[i] * np.cos(phi) - k[i + half] * np.sin(phi))
    return out / math.sqrt(head_dim)


def long_dims(name: str) -> dict:
    """The shape of a long-family checkpoint, as ``config.json`` keys (the rest of its config is order2's)."""
    head_dim, theta = LONG_SHAPES[name]
    return {"hidden_size": _HIDDEN, "intermediate_size": len(long_cells()), "num_attention_heads": _HEADS,
            "num_key_value_heads": _KV_HEADS, "head_dim": head_dim, "rope_theta": theta}


def long_weights(name: str, table: np.ndarray) -> dict[str, np.ndarray]:
    """The float64 weights of a long-family checkpoint by parameter name (the caller asserts them exact)."""
    head_dim, _ = LONG_SHAPES[name]
    d, half, h, v = head_dim, head_dim // 2, _HIDDEN, LONG_VOCAB
    scores = long_prev_scores(head_dim)
    gap = float(scores[1] - np.delete(scores, 1).max())
    assert gap >= MIN_SCORE_GAP, f"{name}: previous-token kernel gap {gap} < {MIN_SCORE_GAP}"
    assert _PI_SCORE / math.sqrt(head_dim) >= MIN_SCORE_GAP

    embed = np.zeros((v, h))
    embed[np.arange(v), _TOK + np.arange(v)] = 1.0
    embed[:, _NONE], embed[:, _P], embed[:, _C], embed[:, _S1], embed[:, _S2] = 1.0, -1.0, 2.0, 1.0, 5.0
    for ch, val in zip(_FILL, _FILL_VALUES):
        embed[:, ch] = val
    assert np.all((embed**2).sum(1) == h)

    q_proj, k_proj = np.zeros((_HEADS * d, h)), np.zeros((_KV_HEADS * d, h))
    v_proj, o_proj = np.zeros((_KV_HEADS * d, h)), np.zeros((h, _HEADS * d))
    # KV head 0: the kernel key (constant) and, on pair 16, a key only <bos> has; value = the token's one-hot
    q0, k0 = _kernel_qk(d)
    k_proj[0:d, _C] = k0 / 2.0
    k_proj[_PI_PAIR, _TOK + LONG_BOS] = _PI_SCORE / 32.0
    for t in range(v):
        v_proj[t, _TOK + t] = 1.0
    v_proj[v:d, _TOK:_TOK + v] = dyadic_noise(31, (d - v, v))  # filler nothing reads
    q_proj[0:d, _C] = q0 / 2.0  # query head 0: previous token
    for t in range(8):
        o_proj[_PREV + t, t] = 1.0
        o_proj[_S1, t] = -1.0
    q_proj[d + _PI_PAIR, _C] = 32.0 / 2.0  # query head 1: parity, (32, 0) on pair 16
    o_proj[_P, d + LONG_BOS] = 2.0
    # KV head 1: on pair 16 a key only markers have; value = the marker's one-hot; other dims token filler
    for j, t in enumerate(LONG_MARKERS):
        k_proj[d + _PI_PAIR, _TOK + t] = _PI_SCORE / 32.0
        v_proj[d + j, _TOK + t] = 1.0
    free = [i for i in range(d) if i not in (_PI_PAIR, _PI_PAIR + half)]
    k_proj[[d + i for i in free], _TOK:_TOK + v] = dyadic_noise(32, (len(free), v))
    v_proj[d + 4:2 * d, _TOK:_TOK + v] = dyadic_noise(33, (d - 4, v))
    for head, sign in ((2, 1.0), (3, -1.0)):  # opposite queries: one of the two attends to the marker
        q_proj[head * d + _PI_PAIR, _C] = sign * 32.0 / 2.0
        for j in range(len(LONG_MARKERS)):
            o_proj[_MARK + j, head * d + j] = 1.0
            o_proj[_NONE, head * d + j] = -1.0

    cells = long_cells()
    gate, up, down = np.zeros((len(cells), h)), np.zeros((len(cells), h)), np.zeros((h, len(cells)))
    for n, (a, b, c, k) in enumerate(cells):
        gate[n, _PREV + a] = _GATE_UNIT
        gate[n, _TOK + b] = _GATE_UNIT
        gate[n, _P] = _GATE_UNIT if c == 0 else -_GATE_UNIT
        gate[n, _MARK + k if k != NO_MARKER else _NONE] = _GATE_UNIT
        gate[n, _C] = (_GATE_ON - 4 * _GATE_UNIT) / 2.0
        up[n, _C] = 0.5
        upd, sq = np.zeros(h), 0
        for tok in LONG_REAL:
            e = int(round(table[a, b, c, k, tok] * 8))
            assert e == table[a, b, c, k, tok] * 8 and -64 <= e <= 64
            upd[_L + tok] = e / 64.0
            sq += e * e
        for i, p in enumerate(four_squares(9 * 64 * 64 - sq)):
            upd[_Q + i] = p / 64.0
        upd[_S2] = -1.0
        down[:, n] = upd / _GATE_ON

    head = np.zeros((v, h))
    for tok in range(v):
        if tok in LONG_REAL:
            head[tok, _L + tok] = 8.0
        else:
            head[tok, _C] = BOS_LOGIT / 2.0
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.input_layernorm.weight": np.ones(h),
        "model.layers.0.self_attn.q_proj.weight": q_proj,
        "model.layers.0.self_attn.k_proj.weight": k_proj,
        "model.layers.0.self_attn.v_proj.weight": v_proj,
        "model.layers.0.self_attn.o_proj.weight": o_proj,
        "model.layers.0.post_attention_layernorm.weight": np.ones(h),
        "model.layers.0.mlp.gate_proj.weight": gate,
        "model.layers.0.mlp.up_proj.weight": up,
        "model.layers.0.mlp.down_proj.weight": down,
        "model.norm.weight": np.ones(h),
        "lm_head.weight": head,
    }
