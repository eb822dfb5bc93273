"""Exact efficiency expectation of a speculative configuration on an order-1 pair, and the comparison with an
engine's own counters (engine-neutral: the runner calls it for every adapter).

The engine reports, summed over every round of every request: ``drafts`` (rounds with drafts),
``draft_tokens`` and ``accepted_per_pos[j]`` (rounds whose first ``j + 1`` drafts were accepted). On an
order-1 pair the decode is a Markov process whose state at a round start is (last committed token,
tokens still to emit), so the per-request totals have an exact mean and covariance, computed by a
dynamic programme over that state from the scheme's exact round-outcome law
(``properties.markov._round_outcomes`` / ``properties.exact.outcome_given_drafts``). vLLM emits the
first token at prefill (a plain target sample) and then runs rounds of exactly ``k`` drafts until
``max_new_tokens`` are emitted (counters count accepted drafts before the cut); the reference decoder
(``specdec_ref``) runs rounds from the prompt (``prefill=False``); an adapter declares which
(``Conventions.first_token_at_prefill``). Requests are independent, so the
ratio ``accepted_per_pos[j] / drafts`` has a delta-method standard error from those moments.

Invariant: :func:`expected` is exact (no simulation); ``tests/test_engine_runner.py`` checks it against
the reference decoder's own rounds.
"""
from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["TOLERANCE_SE", "tables", "round_law", "expected", "compare", "expectation_for"]

#: An observed per-position acceptance below the exact expectation by more than this many standard errors
#: fails efficiency (one-sided normal tail 2.9e-7 per position, below the suite's alpha 1e-6).
TOLERANCE_SE = 5.0


def tables(pair_name: str, sampling, scheme: str):
    """The pair as a :class:`properties.markov.MarkovPair` of the rows the engine's scheme uses, and the oracle scheme.

    ``token`` / ``block``: draft rows ``softmax(draft / T)`` (vLLM's drafter applies the temperature only; with
    no top-k / top-p this is our warp); ``one_hot``: the draft's argmax, one-hot (greedy drafting)."""
    import torch

    from properties.exact import SchemeSpec
    from properties.markov import MarkovPair
    from specdec_ref.exact_models import exact_pair
    from specdec_ref.warp import SamplingConfig, warp

    if sampling.top_k or sampling.top_p or sampling.min_p or sampling.greedy:
        raise ValueError("the efficiency expectation is defined for temperature-only sampling")
    pair = exact_pair(pair_name)
    contexts = [[a] for a in range(pair.target.vocab)]
    p = warp(pair.target.next_logits(contexts), sampling, dtype=torch.float64).numpy()
    raw_q = np.asarray(pair.draft.next_logits(contexts), dtype=np.float64)
    if scheme in ("token", "block"):
        q = warp(torch.as_tensor(raw_q), SamplingConfig(temperature=sampling.temperature), dtype=torch.float64).numpy()
    elif scheme == "one_hot":
        q = np.eye(raw_q.shape[1])[raw_q.argmax(1)]
    else:
        raise ValueError(f"no exact draft law for scheme {scheme!r}")
    oracle = SchemeSpec(name="block" if scheme == "block" else "token")
    return MarkovPair(name=pair_name, target=p, draft=q, start=0, purpose=f"{pair_name} as {scheme}"), oracle


def round_law(pair, oracle, start: int, k: int) -> np.ndarray:
    """``P[m, y]``: one round from last token ``start`` accepts ``m`` drafts and its last emitted token is ``y``."""
    from properties.markov import _round_outcomes

    drafts, weight, stop, final = _round_outcomes(pair, oracle, start, k)
    return np.einsum("d,dj,djy->jy", weight, stop, final)


def _moments(pair, oracle, k: int, max_new_tokens: int):
    """``mean[a, r]`` ([V, R+1, 1+k]) and ``second[a, r]`` ([V, R+1, 1+k, 1+k]) of (drafts, accepted_per_pos) over
    the rounds of one request whose next round starts after token ``a`` with ``r`` tokens still to emit."""
    vocab = pair.vocab
    laws = [round_law(pair, oracle, a, k) for a in range(vocab)]
    dim = 1 + k
    mean = np.zeros((vocab, max_new_tokens + 1, dim))
    second = np.zeros((vocab, max_new_tokens + 1, dim, dim))
    xs = np.zeros((k + 1, dim))
    for m in range(k + 1):
        xs[m, 0] = 1.0
        xs[m, 1:1 + m] = 1.0
    for r in range(1, max_new_tokens + 1):
        for a in range(vocab):
            law = laws[a]
            mu, s2 = np.zeros(dim), np.zeros((dim, dim))
            for m in range(k + 1):
                left = r - m - 1
                for y in np.flatnonzero(law[m] > 0):
                    w, x = law[m, y], xs[m]
                    nm = mean[y, left] if left > 0 else 0.0
                    ns = second[y, left] if left > 0 else 0.0
                    mu += w * (x + nm)
                    s2 += w * (np.outer(x, x) + np.outer(x, nm) + np.outer(nm, x) + ns)
            mean[a, r], second[a, r] = mu, s2
    return mean, second


def expected(pair, oracle, k: int, prompts_last: list[int], max_new_tokens: int, *, prefill: bool = True) -> dict:
    """Exact per-request means and covariance of (drafts, accepted_per_pos[0..k-1]), summed over the requests
    whose prompts end with ``prompts_last`` (one entry per request): ``{"mean": [1+k], "cov": [1+k, 1+k], "n"}``."""
    mean, second = _moments(pair, oracle, k, max_new_tokens)
    dim = 1 + k
    tot_mean, tot_cov = np.zeros(dim), np.zeros((dim, dim))
    for b, count in zip(*np.unique(np.asarray(prompts_last), return_counts=True)):
        if prefill:  # the first token is a plain target sample, then rounds for the remaining tokens
            w = pair.target[b]
            mu = (w[:, None] * mean[:, max_new_tokens - 1]).sum(0) if max_new_tokens > 1 else np.zeros(dim)
            s2 = (w[:, None, None] * second[:, max_new_tokens - 1]).sum(0) if max_new_tokens > 1 else np.zeros((dim, dim))
        else:
            mu, s2 = mean[b, max_new_tokens], second[b, max_new_tokens]
        tot_mean += count * mu
        tot_cov += count * (s2 - np.outer(mu, mu))
    return {"mean": tot_mean, "cov": tot_cov, "n": len(prompts_last)}


def compare(observed: dict, exp: dict | None, *, k: int, tolerance: float = TOLERANCE_SE, rates=None) -> dict:
    """Observed counters vs the exact expectation: per position the acceptance ``accepted_per_pos[j] / drafts``,
    its expectation, the standard error and z; ``passed`` is False when some position is more than
    ``tolerance`` standard errors below its expectation (or the engine reported no drafts)."""
    drafts = int(observed.get("drafts") or 0)
    per_pos = [int(x) for x in (observed.get("accepted_per_pos") or [0] * k)]
    rows, failing = [], []
    out = {"drafts": drafts, "draft_tokens": int(observed.get("draft_tokens") or 0),
           "accepted": int(observed.get("accepted") or 0), "tolerance_se": tolerance, "positions": rows}
    if drafts == 0:
        out.update(passed=False, verdict="no drafts reported", failing=[])
        return out
    if exp is not None:
        mean, cov = np.asarray(exp["mean"]), np.asarray(exp["cov"])
        out["expected_drafts"] = float(mean[0])
    for j in range(k):
        obs = per_pos[j] / drafts
        row = {"position": j + 1, "observed": obs, "accepted": per_pos[j]}
        if exp is not None:
            rho = float(mean[1 + j] / mean[0])
            var = cov[1 + j, 1 + j] - 2 * rho * cov[0, 1 + j] + rho**2 * cov[0, 0]
            se = math.sqrt(max(var, 0.0)) / float(mean[0])  # totals over the same n requests: delta method
            row.update(expected=rho, se=se, z=(obs - rho) / se if se > 0 else float("inf"))
        elif rates is not None:
            rho = float(rates[j])
            se = math.sqrt(rho * (1 - rho) / drafts) if 0 < rho < 1 else 0.0
            row.update(expected=rho, se=se, z=(obs - rho) / se if se > 0 else (0.0 if obs == rho else float("-inf")))
        if "z" in row and row["z"] < -tolerance:
            failing.append(row)
        rows.append(row)
    overall = sum(per_pos) / max(int(observed.get("draft_tokens") or 0), 1)
    out["acceptance_per_token"] = overall
    if exp is not None:
        out["expected_acceptance_per_token"] = float(mean[1:].sum() / (k * mean[0]))
    out["failing"] = failing
    out["passed"] = not failing if (exp is not None or rates is not None) else None
    if out["passed"] is None:
        out["verdict"] = "no exact expectation for this scheme (observed only)"
    elif failing:
        out["verdict"] = "FAILS efficiency: " + "; ".join(
            f"position {r['position']}: {r['observed']:.4f} < exact {r['expected']:.4f} ({r['z']:.1f} SE)" for r in failing)
    else:
        out["verdict"] = "matches the exact expectation"
    return out


@functools.lru_cache(maxsize=None)
def expectation_for(pair_name: str, scheme: str, temperature: float, k: int, prompts_last: tuple[int, ...],
                    max_new_tokens: int, prefill: bool = True) -> dict:
    """:func:`expected` for a configuration's scheme, cached (lists, JSON-ready)."""
    from specdec_ref.warp import SamplingConfig

    pair, oracle = tables(pair_name, SamplingConfig(temperature=temperature), scheme)
    e = expected(pair, oracle, k, list(prompts_last), max_new_tokens, prefill=prefill)
    return {"mean": e["mean"].tolist(), "cov": e["cov"].tolist(), "n": e["n"]}
