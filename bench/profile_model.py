"""The cost model of speculative decoding, fitted to measured costs and checked against measured speedups.

Terms (seconds; every forward timed on the reference lean forward, cache at the profile's mean context, before and
after the timed decodes, the smaller of the two kept per term: :func:`least_interfered`):

* ``C_T`` = a target forward of one token per row, ``C_D`` = a draft forward of one token per row,
  ``C_V(k)`` = a target forward of ``k + 1`` tokens per row (the verification block);
* ``o_ar`` = AR host work per step: the measured AR seconds per token less ``C_T``;
* ``o_d`` = host work per drafted token (processing the draft's logits, sampling), ``o_0`` = host work per
  round (the target rows' processing, the verifier, the host sync, the repair's bookkeeping, rows leaving).

A round of ``k`` drafts costs ``R(k) = k (C_D + o_d) + C_V(k) + f_k C_D + o_0`` (``f_k``: the measured share of
rounds accepting every draft, which feed ``d_k`` to the draft in the repair) and emits ``E(k)`` tokens, with
``E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j`` from the measured acceptance ``a_j`` of draft position ``j`` (pooled
over every k; not one alpha). Predicted seconds per token (of each row) ``R(k) / E(k) x tail`` against AR's
``C_T + o_ar``: the predicted speedup. ``tail`` (measured) = the rows' mean tokens per round over the tokens per row per
*batch* round: 1 at B = 1 but for the last round's cut, above 1 when rows of a batch finish in different rounds. ``o_d`` and ``o_0`` are fitted: from the backend's reported phases when it reports them
(draft phase per round / k - C_D; verify - C_V(k), repair - f_k C_D and other, per round; medians over k),
else by least squares of the measured round time over k. A gap above :data:`GAP_TOLERANCE` names the term
that is off: the tokens per round (acceptance) or, per phase, the one whose measured seconds per round
stray furthest from the model's.

A proposer without a draft model: ``C_D`` is its decoder layers' forward (an EAGLE head: the one layer it runs per
draft step, the catch-up being the round's first step; its ``fc`` and lm_head land in ``o_d``), or 0 for prompt
lookup, whose host work is all ``o_d``; no ``f_k C_D`` term (nothing is fed in the repair: a head reads the bonus
token in its next catch-up).

From the fit: the breakeven acceptance per k (one alpha for every position: ``E = sum_{i<=k} alpha^i`` and
``f_k = alpha^k``), the best k, and the draft forward cost (in target forwards) below which each k would pay
at the measured acceptance.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Sequence

import torch

from .batch import expected_tokens_per_round, forward_seconds
from .profile_stats import Interval

__all__ = ["GAP_TOLERANCE", "Costs", "measure_costs", "least_interfered", "fit_model", "breakeven_alpha", "verdict"]

#: |measured / predicted - 1| above which the report names the term that is off.
GAP_TOLERANCE = 0.10


@dataclass
class Costs:
    target: float  # C_T
    draft: float  # C_D
    verify: dict[int, float]  # C_V(k)
    context: int  # tokens in the cache when timed
    #: 1 when a fully accepted round feeds ``d_k`` to the drafter in the repair (a draft model), 0 when it does not (a
    #: head reads the bonus token in its next round's catch-up, its first draft step; prompt lookup runs no forward)
    feeds_bonus: float = 1.0

    def bonus_feed(self, full: float, draft: float | None = None) -> float:
        """The repair's drafter forward per round: ``f_k C_D`` (0 for a proposer that feeds nothing)."""
        return self.feeds_bonus * full * (self.draft if draft is None else draft)

    def as_dict(self) -> dict:
        return {"C_T": self.target, "C_D": self.draft, "C_V": {str(k): v for k, v in self.verify.items()}, "context": self.context,
                "feeds_bonus": self.feeds_bonus,
                "c": self.draft / self.target, "r": {str(k): v / self.target for k, v in self.verify.items()}}


def drafter_module(draft):
    """The module a proposer runs per draft step: the draft model, a head's decoder layers (``layers``), or None
    (prompt lookup, or a head without layers: no forward worth timing)."""
    from specdec_ref.proposers import is_model

    return draft if is_model(draft) else getattr(draft, "layers", None)


def measure_costs(target, draft, prompts: Sequence[torch.Tensor], ks: Sequence[int], *, context: int, seconds: float,
                  repeats: int = 3) -> Costs:
    """``C_T``, ``C_D`` and ``C_V(k)`` at ``len(prompts)`` rows with ``context`` tokens in the cache (each prompt is
    extended with its own tokens, repeated, to ``context``: the cost does not depend on the values). ``draft`` may be a
    proposer spec: ``C_D`` is then its decoder layers' forward (:func:`drafter_module`; a head's ``fc`` and lm_head are
    left to ``o_d``), or 0 for prompt lookup, and nothing is fed in the repair."""
    from specdec_ref.proposers import is_model

    longest = context + max(ks) + 2
    grown = []
    for p in prompts:
        reps = -(-context // p.shape[1])
        grown.append(p.repeat(1, reps)[:, :context])
    timing = dict(repeats=repeats, min_seconds=seconds, max_length=longest)
    module = drafter_module(draft)
    return Costs(
        target=forward_seconds(target, grown, 1, **timing),
        draft=0.0 if module is None else forward_seconds(module, grown, 1, **timing),
        verify={k: forward_seconds(target, grown, k + 1, **timing) for k in ks},
        context=context, feeds_bonus=1.0 if is_model(draft) else 0.0,
    )


def least_interfered(a: Costs, b: Costs) -> Costs:
    """Per term, the smaller of two measurements of the same costs (taken before and after the timed runs): another
    process on a shared machine only ever makes a forward slower, and a one-shot cost burst is more exposed to it than
    the interleaved, median-summarised decodes."""
    return Costs(target=min(a.target, b.target), draft=min(a.draft, b.draft),
                 verify={k: min(a.verify[k], b.verify[k]) for k in a.verify}, context=a.context, feeds_bonus=a.feeds_bonus)


def predicted_tokens(conditional: Sequence[float], k: int) -> float:
    """``1 + sum_{i<=k} prod_{j<=i} a_j`` (positions beyond the measured ones reuse the last measured rate)."""
    total, run = 1.0, 1.0
    for i in range(k):
        a = conditional[min(i, len(conditional) - 1)] if conditional else 0.0
        run *= a
        total += run
    return total


def _fit_overheads(costs: Costs, per_k: dict[int, dict]) -> dict:
    """``o_d`` and the per-round terms (module docstring); ``source`` says how they were obtained."""
    ks = sorted(per_k)
    if all(per_k[k].get("phases") for k in ks):
        ph = {k: per_k[k]["phases"] for k in ks}
        o_d = median(ph[k]["draft"] / k - costs.draft for k in ks)
        o_v = median(ph[k]["verify"] - costs.verify[k] for k in ks)
        o_r = median(ph[k]["repair"] - costs.bonus_feed(per_k[k]["full"]) for k in ks)
        o_o = median(ph[k]["other"] for k in ks)
        return {"source": "backend-reported phases", "o_d": o_d, "o_verify": o_v, "o_repair": o_r, "o_other": o_o,
                "o_0": o_v + o_r + o_o}
    # least squares of residual(k) = k o_d + o_0 over k (o_d = 0 with a single k)
    xs = ks
    ys = [per_k[k]["round"] - (k * costs.draft + costs.verify[k] + costs.bonus_feed(per_k[k]["full"])) for k in ks]
    if len(xs) == 1:
        o_d, o_0 = 0.0, ys[0]
    else:
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        o_d = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        o_0 = my - o_d * mx
    exact = " (2 parameters on 2 k values: exact by construction, not a check)" if len(xs) == 2 else ""
    return {"source": f"least squares on the measured round time over {len(xs)} k values (no phases reported){exact}", "o_d": o_d, "o_0": o_0,
            "o_verify": None, "o_repair": None, "o_other": None}


def round_cost(costs: Costs, fit: dict, k: int, full: float, draft: float | None = None) -> float:
    """``R(k) = k (C_D + o_d) + C_V(k) + f_k C_D + o_0`` (``draft`` replaces ``C_D``)."""
    c_d = costs.draft if draft is None else draft
    return k * (c_d + fit["o_d"]) + costs.verify[k] + costs.bonus_feed(full, c_d) + fit["o_0"]


def breakeven_alpha(ar: float, costs: Costs, fit: dict, k: int, tail: float = 1.0) -> float | None:
    """Smallest alpha (the same at every position) at which ``R(k) / E(alpha, k) x tail`` reaches AR's cost; None if never."""
    def gain(a: float) -> float:
        return ar * expected_tokens_per_round(a, k) / tail - round_cost(costs, fit, k, a**k)

    if gain(1.0) < 0:
        return None
    if gain(0.0) >= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gain(mid) < 0 else (lo, mid)
    return hi


def draft_threshold(ar: float, costs: Costs, fit: dict, k: int, tokens: float, full: float, tail: float = 1.0) -> float | None:
    """Draft forward cost (in target forwards) below which k pays at the measured acceptance; None if no draft can."""
    x = (ar * tokens / tail - costs.verify[k] - fit["o_0"] - k * fit["o_d"]) / (k + costs.feeds_bonus * full)
    return x / costs.target if x > 0 else None


def _name_term(costs: Costs, fit: dict, k: int, row: dict, d: dict) -> str | None:
    """The term furthest from the model at this k (module docstring), or None within tolerance."""
    if abs(row["gap"]) <= GAP_TOLERANCE:
        return None
    e_gap = d["tokens_per_round"] / row["tokens_predicted"] - 1
    if abs(e_gap) > GAP_TOLERANCE / 2:
        return f"tokens per round (acceptance): measured {d['tokens_per_round']:.2f} vs predicted {row['tokens_predicted']:.2f}"
    ph = d.get("phases")
    if ph:
        model = {
            "draft": k * (costs.draft + fit["o_d"]),
            "verify": costs.verify[k] + fit["o_verify"],
            "repair": costs.bonus_feed(d["full"]) + fit["o_repair"],
            "other": fit["o_other"],
            "unreported": 0.0,
        }
        seen = dict(ph, unreported=d["round"] - sum(ph[p] for p in ("draft", "verify", "repair", "other")))
        name = max(model, key=lambda p: abs(seen[p] - model[p]))
        return f"{name}: {1e3 * seen[name]:.3f} ms per round measured vs {1e3 * model[name]:.3f} ms modelled"
    return (f"round cost (host work not reported by the backend): {1e3 * d['round']:.3f} ms per round measured vs "
            f"{1e3 * row['round_predicted']:.3f} ms modelled")


def fit_model(costs: Costs, ar_per_token: float, per_k: dict[int, dict], ratios: dict[int, Interval]) -> dict:
    """The fitted model and one row per k: measured beside predicted (module docstring).

    ``per_k[k]``: ``tokens_per_round``, ``full``, ``round`` (measured seconds per decode round), ``per_token``
    (median measured seconds per token), ``conditional`` (acceptance per position), optional ``phases``
    (backend-reported seconds per round: draft, verify, repair, other)."""
    fit = _fit_overheads(costs, per_k)
    fit["o_ar"] = ar_per_token - costs.target
    fit["ar_per_token"] = ar_per_token
    reached: dict[int, list[float]] = {}
    for d in per_k.values():
        for j, (a, n) in enumerate(zip(d["conditional"], d["reached"])):
            reached.setdefault(j, []).append((a, n))
    pooled = [sum(a * n for a, n in reached[j]) / sum(n for _, n in reached[j]) for j in sorted(reached)]
    fit["acceptance_by_position"] = pooled
    rows = []
    for k in sorted(per_k):
        d = per_k[k]
        tokens = predicted_tokens(pooled, k)
        rnd = round_cost(costs, fit, k, d["full"])
        tail = d["tokens_per_round"] / d["tokens_per_batch_round"]
        predicted = ar_per_token / (rnd / tokens * tail)
        measured = ratios[k]
        row = {
            "k": k, "measured": measured.value, "low": measured.low, "high": measured.high, "predicted": predicted,
            "gap": measured.value / predicted - 1, "tokens_per_round": d["tokens_per_round"], "tokens_predicted": tokens,
            "alpha": d["alpha"], "full": d["full"], "round": d["round"], "round_predicted": rnd,
            "per_token": d["per_token"], "per_token_predicted": rnd / tokens * tail, "tail": tail,
            "forward_only": ar_per_token / ((k * costs.draft + costs.verify[k] + costs.bonus_feed(d["full"])) / tokens * tail),
            "breakeven_alpha": breakeven_alpha(ar_per_token, costs, fit, k, tail),
            "draft_threshold": draft_threshold(ar_per_token, costs, fit, k, d["tokens_per_round"], d["full"], tail),
            "phases": d.get("phases"),
        }
        row["term_off"] = _name_term(costs, fit, k, row, d)
        rows.append(row)
    return {"fit": fit, "rows": rows}


def verdict(model: dict, costs: Costs) -> str:
    """``PAYS: 1.42x [1.37, 1.47] at k=3`` when the best k's interval lies above 1, else ``DOES NOT PAY: ...`` with
    the draft's cost and what would make it pay (the breakeven alpha and the draft cost threshold)."""
    rows = model["rows"]
    best = max(rows, key=lambda r: r["measured"])
    shown = Interval(best["measured"], best["low"], best["high"]).text()
    if best["low"] > 1.0:
        return f"PAYS: {shown} at k={best['k']}"
    parts = [f"DOES NOT PAY: best {shown} at k={best['k']}", f"the draft costs {costs.draft / costs.target:.2f} target forwards"]
    alphas = [r for r in rows if r["breakeven_alpha"] is not None]
    drafts = [r for r in rows if r["draft_threshold"] is not None]
    remedies = []
    if alphas:
        a = min(alphas, key=lambda r: r["breakeven_alpha"])
        remedies.append(f"from alpha >= {a['breakeven_alpha']:.2f} at k={a['k']}")
    if drafts:
        d = max(drafts, key=lambda r: r["draft_threshold"])
        remedies.append(f"with a draft below {d['draft_threshold']:.2g} target forwards")
    if remedies:
        parts.append("it would pay " + " or ".join(remedies))
    else:
        parts.append("no acceptance and no draft cost make it pay: the verification forward and the per-round host work "
                     "alone cost more than the tokens a round emits")
    if best["measured"] > 1.0:
        parts[0] += " (the interval reaches 1)"
    return "; ".join(parts)
