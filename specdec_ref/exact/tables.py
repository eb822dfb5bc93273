"""The exactly-known next-token tables: the law of every exact model, as numbers (no checkpoint here).

Invariant: every table entry is an integer number of eighths in [-64, 64] (a logit in [-8, 8], a dyadic
number exact in bfloat16), and every reachable row has a unique maximum over the real tokens (greedy is
unambiguous); order2's ``<bos>`` column is :data:`BOS_LOGIT`. The tables are deterministic: written out
(order1) or drawn from pure-Python integers (splitmix64, order2), never from numpy's or torch's generators.
This module is the single source of truth of the laws; :mod:`specdec_ref.exact.registry` names them,
:mod:`specdec_ref.exact.weights` realises them as Llama weights.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "BOS_LOGIT",
    "ORDER1_VOCAB",
    "ORDER1_EOS",
    "ORDER2_VOCAB",
    "ORDER2_BOS",
    "ORDER2_EOS",
    "ORDER2_REAL",
    "TABLES",
    "bell_ints",
    "order2_cells",
    "splitmix64",
    "token_names",
    "unique_max_",
]

#: Table logit of ``<bos>`` in the order2 family: exp(BOS_LOGIT - max) underflows to exactly 0 in
#: float64 and float32 for any temperature <= ~80, so ``<bos>`` is never generated.
BOS_LOGIT: float = -(2.0**16)

# All table entries are in eighths (integers): logit = entry / 8, within [-8, 8].

# --------------------------------------------------------------------------- order1
# Vocabulary: "t0".."t6" (ids 0..6), "<eos>" (id 7). Row = last token, column = next token.
#
# Design (asserted by tests/test_exact_models.py):
# * the maximum of every row is unique (greedy is unambiguous);
# * exact ties just below the top: row 0: 2nd = 3rd = 4th (tokens 1, 2, 3 at 1.0: top_k = 2 and 3 keep
#   four tokens), row 2: 3rd = 4th = 5th (tokens 2, 4, 5 at 0.5), row 4: 4th = 5th = 6th (tokens 1, 2, 6
#   at 0.75), row 5: 2nd = 3rd (tokens 3, 6 at 1.5), row 6: 3rd = 4th (tokens 1, 5 at 0.5), row 7: 2nd =
#   3rd (tokens 0, 1 at 1.0);
# * EOS has probability 0.1 .. 0.3 in rows 1, 2, 4 and 7.
_ORDER1_TARGET = (
    (24, 8, 8, 8, -8, -16, -4, 4),
    (4, -2, 12, 0, 6, -8, 2, 10),
    (-12, 18, 4, -6, 4, 4, -16, 8),
    (10, 0, -8, 20, 0, 14, -4, -24),
    (-4, 6, 6, 0, 8, 16, 6, 12),
    (32, -8, 2, 12, -20, 0, 12, 7),
    (0, 4, -10, 2, 22, 4, 8, 1),
    (8, 8, 4, -4, 0, 2, -8, 11),
)
# target + small perturbation: mean token-wise acceptance ~0.90
_ORDER1_CLOSE = (
    (25, 6, 7, 1, -3, -13, -5, 6),
    (5, -4, 15, -1, 5, -10, 3, 10),
    (-10, 16, 4, -9, 7, 5, -15, 9),
    (7, 2, -2, 15, -5, 9, -1, -24),
    (-1, 8, 7, 1, 7, 19, 3, 11),
    (33, -3, 0, 9, -22, 3, 11, 11),
    (-6, 7, -7, -2, 22, 8, 8, 4),
    (15, 9, 3, -6, 2, 1, -9, 11),
)
# target + large perturbation: mean token-wise acceptance ~0.60 (argmax differs in rows 0, 1, 3, 6, 7)
_ORDER1_FAR = (
    (18, 6, 23, 14, -22, -16, -9, 5),
    (-10, 0, 14, 14, 9, -4, -11, 30),
    (-29, 28, 1, -14, -2, -2, -13, 7),
    (23, -16, -8, 12, 7, -5, -7, -22),
    (-17, 15, 8, 9, 16, 7, -1, 10),
    (39, -1, -4, 7, -27, -5, 10, 6),
    (18, 0, -13, 6, 14, 1, 8, 8),
    (-4, 20, 1, -3, 7, 8, 1, 13),
)

ORDER1_VOCAB = 8
ORDER1_EOS = 7

# --------------------------------------------------------------------------- order2
# Vocabulary: "t0".."t5" (ids 0..5), "<bos>" (id 6), "<eos>" (id 7). A context is
# [<bos>, x_1, .., x_m]; the next-token logits after it are T2[a, b, c] with b = x_m (the last token,
# at position m), a = x_{m-1} (the token before it; <bos> when m == 1, and a = b = <bos> when m == 0)
# and c = m % 2. Reachable cells: (<bos>, <bos>, 0), (<bos>, b, 1) and (a, b, c) for a, b real tokens.

ORDER2_VOCAB = 8
ORDER2_BOS = 6
ORDER2_EOS = 7
ORDER2_REAL = (0, 1, 2, 3, 4, 5, 7)
_ORDER2_EOS_BASE = (-6, 2, -2, 4, -8, 2, -2, -10)  # eighths added to the EOS logit, by last token b


def order2_cells() -> tuple[tuple[int, int, int], ...]:
    """Every reachable (a, b, c) cell, in a fixed order (the order of the MLP units)."""
    bos = ORDER2_BOS
    cells = [(bos, bos, 0)] + [(bos, b, 1) for b in ORDER2_REAL]
    cells += [(a, b, c) for a in ORDER2_REAL for b in ORDER2_REAL for c in (0, 1)]
    return tuple(cells)


_MASK64 = (1 << 64) - 1


def splitmix64(seed: int):
    """splitmix64: a platform-independent integer stream (pure Python ints)."""
    state = seed & _MASK64
    while True:
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        yield z ^ (z >> 31)


def bell_ints(seed: int, shape: tuple[int, ...], spread: int) -> np.ndarray:
    """Bell-shaped integers: each the sum of 4 uniforms on [-spread, spread] (sd ~ 1.15 * spread)."""
    stream = splitmix64(seed)
    n = int(np.prod(shape))
    values = [sum(int(next(stream) % (2 * spread + 1)) - spread for _ in range(4)) for _ in range(n)]
    return np.array(values, dtype=np.int64).reshape(shape)


def unique_max_(row: np.ndarray, real=ORDER2_REAL) -> None:
    """Raise the first-index maximum of ``row`` (eighths, over the ``real`` tokens) by 1 if it is tied."""
    order = sorted(real, key=lambda v: (-row[v], v))
    if row[order[0]] == row[order[1]]:
        row[order[0]] += 1


def _shape_order2_rows(table: np.ndarray) -> np.ndarray:
    """Add exact ties below the top (cells k % 6 == 3: 2nd = 3rd = 4th; k % 6 == 5: 3rd = 4th) and make
    every row's maximum unique (greedy unambiguous). ``table``: int eighths [a, b, c, v]."""
    table = table.copy()
    for k, (a, b, c) in enumerate(order2_cells()):
        row = table[a, b, c]
        order = sorted(ORDER2_REAL, key=lambda v: (-row[v], v))
        if k % 6 == 3:
            row[order[2]] = row[order[1]]
            row[order[3]] = row[order[1]]
        elif k % 6 == 5:
            row[order[3]] = row[order[2]]
        unique_max_(row)
    return table


def _order2_target_eighths() -> np.ndarray:
    """T2 in eighths, int64 [a, b, c, v] (v = <bos> column unused: it is BOS_LOGIT)."""
    v = ORDER2_VOCAB
    base = bell_ints(1, (v, v), 9)  # order-1 part: by last token b
    inter = bell_ints(2, (v, v, v), 5)  # by (a, b)
    parity = bell_ints(3, (v, v), 5)  # by (b), sign flips with the parity c
    table = base[None, :, None, :] + inter[:, :, None, :]
    table = table + np.stack([-parity, parity], axis=1)[None, :, :, :]
    table[..., ORDER2_EOS] += np.asarray(_ORDER2_EOS_BASE)[None, :, None]
    return _shape_order2_rows(np.clip(table, -64, 64))


def _order2_order1_draft_eighths(target: np.ndarray) -> np.ndarray:
    """An order-1 draft for T2: per last token b, the target logits averaged over its reachable cells
    (rounded to eighths); it ignores the previous token and the position."""
    out = np.zeros_like(target)
    cells = order2_cells()
    for b in range(ORDER2_VOCAB):
        rows = [target[a, bb, c] for a, bb, c in cells if bb == b]
        if rows:
            mean = np.mean(np.asarray(rows, dtype=np.float64), axis=0)
            row = np.floor(mean + 0.5).astype(np.int64)
            unique_max_(row)
            out[:, b, :, :] = row[None, None, :]
    return out


def _order2_close_draft_eighths(target: np.ndarray) -> np.ndarray:
    """An order-2 draft close to T2: target plus bell-shaped noise (spread 2 eighths)."""
    table = np.clip(target + bell_ints(7, target.shape, 2), -64, 64)
    for a, b, c in order2_cells():
        unique_max_(table[a, b, c])
    return table


def _order1_table(eighths) -> np.ndarray:
    return np.asarray(eighths, dtype=np.float64) / 8.0


def _order2_table(eighths: np.ndarray) -> np.ndarray:
    table = eighths.astype(np.float64) / 8.0
    table[..., ORDER2_BOS] = BOS_LOGIT
    return table


def _logit_tables() -> dict[str, np.ndarray]:
    t2 = _order2_target_eighths()
    tables = {
        "order1-target": _order1_table(_ORDER1_TARGET),
        "order1-draft-close": _order1_table(_ORDER1_CLOSE),
        "order1-draft-far": _order1_table(_ORDER1_FAR),
        "order1-draft-same": _order1_table(_ORDER1_TARGET),
        "order2-target": _order2_table(t2),
        "order2-draft": _order2_table(_order2_order1_draft_eighths(t2)),
        "order2-draft-close": _order2_table(_order2_close_draft_eighths(t2)),
    }
    for table in tables.values():
        table.setflags(write=False)  # the law: read-only
    return tables


#: float64 logit table of every base model, by name: ``[V, V]`` (order1, row = last token) or
#: ``[V, V, 2, V]`` (order2, cell (a, b, c)); read-only.
TABLES: dict[str, np.ndarray] = _logit_tables()


def token_names(family: str) -> list[str]:
    """The vocabulary of ``family`` (``"order1"`` or ``"order2"``), by id."""
    if family == "order1":
        return [f"t{i}" for i in range(ORDER1_VOCAB - 1)] + ["<eos>"]
    return [f"t{i}" for i in range(6)] + ["<bos>", "<eos>"]
