"""Exact efficiency expectation of a speculative configuration on an order-1 pair, and the comparison with an
engine's own counters (engine-neutral: the runner calls it for every adapter).

The engine reports, summed over every round of every request: ``drafts`` (rounds with drafts),
``draft_tokens`` and ``accepted_per_pos[j]`` (rounds whose first ``j + 1`` drafts were accepted). On an
order-1 pair the decode is a Markov process whose state at a round start is (last committed token,
tokens still to emit), so the per-request totals have an exact mean and covariance, computed by a
dynamic programme over that state from the scheme's exact round-outcome law
(``specdec_properties.markov._round_outcomes`` / ``specdec_properties.exact.outcome_given_drafts``). vLLM emits the
first token at prefill (a plain target sample) and then runs rounds of exactly ``k`` drafts until
``max_new_tokens`` are emitted (counters count accepted drafts before the cut); the reference decoder
(``specdec_ref``) runs rounds from the prompt (``prefill=False``); an adapter declares which
(``Conventions.first_token_at_prefill``). Requests are independent, so the
ratio ``accepted_per_pos[j] / drafts`` has a delta-method standard error from those moments.

``sample_match`` (llama.cpp's speculation, :func:`sample_match_expected`): the drafter proposes the draft
model's argmax (llama.cpp's draft sampler sorts the draft's candidates and keeps ``data[0]``) along the
deterministic path from the last token, while its confidence (softmax of the raw draft logits) is at least
``p_min``, at most ``n_max`` tokens and at most ``r - 1`` when ``r`` tokens are still to emit (the server's
``get_n_draft_max``); fewer than ``n_min`` drafts are dropped, and a round without drafts is one plain target
step (no verification counted). The target samples every position with the request's own generator and keeps
drafts while they equal its samples, so a round from ``a`` accepts ``d_j`` with probability ``p(d_j | d_{j-1})``:
the law of one-hot rejection sampling (tested). Rounds have variable length, so the expectation also carries the
per-request totals ``(draft_tokens, accepted)`` (:func:`compare` tests their ratio, one-sided, whenever the
expectation has them; it is the only test when the engine gives no per-position counters), and, beside it, what
token-wise rejection sampling with the draft's own law ``softmax(draft / T)`` would accept on rounds of the same
lengths: the acceptance the engine leaves on the table.

Invariant: :func:`expected` and :func:`sample_match_expected` are exact (no simulation);
``tests/test_engine_runner.py`` checks :func:`expected` against the reference decoder's own rounds,
``tests/test_llamacpp_efficiency.py`` checks :func:`sample_match_expected` against hand cases and a direct
simulation of llama.cpp's rule.
"""
from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["TOLERANCE_SE", "tables", "round_law", "expected", "compare", "expectation_for", "draft_path",
           "sample_match_round", "variable_moments", "sample_match_expected"]

#: An observed per-position acceptance below the exact expectation by more than this many standard errors
#: fails efficiency (one-sided normal tail 2.9e-7 per position, below the suite's alpha 1e-6).
TOLERANCE_SE = 5.0


def tables(pair_name: str, sampling, scheme: str):
    """The pair as a :class:`specdec_properties.markov.MarkovPair` of the rows the engine's scheme uses, and the oracle scheme.

    ``token`` / ``block``: draft rows ``softmax(draft / T)`` (vLLM's drafter applies the temperature only; with
    no top-k / top-p this is our warp); ``one_hot``: the draft's argmax, one-hot (greedy drafting)."""
    import torch

    from specdec_properties.exact import SchemeSpec
    from specdec_properties.markov import MarkovPair
    from specdec_ref.exact import exact_pair
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
    from specdec_properties.markov import _round_outcomes

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
    ``tolerance`` standard errors below its expectation (or the engine reported no drafts).

    When the expectation carries per-request ``totals`` (mean and covariance of ``(draft_tokens, accepted)``:
    rounds of variable length), the ratio ``accepted / draft_tokens`` is tested the same way (one-sided,
    delta-method standard error), and it is the only test when the engine reports no ``accepted_per_pos``;
    ``rejection_acceptance_per_token`` (what token-wise rejection sampling would accept) is reported beside it."""
    drafts = int(observed.get("drafts") or 0)
    totals = (exp or {}).get("totals")
    # no per-position counts: the per-request totals are the test, or (no expectation at all) the engine's totals
    no_pos = observed.get("accepted_per_pos") is None and (totals is not None or (exp is None and rates is None))
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
    for j in range(0 if no_pos else k):
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
    accepted = out["accepted"] if no_pos else sum(per_pos)
    overall = accepted / max(int(observed.get("draft_tokens") or 0), 1)
    out["acceptance_per_token"] = overall
    if exp is not None:
        out["expected_acceptance_per_token"] = float(mean[1:].sum() / (k * mean[0]))
    if totals is not None:
        tm, tc = np.asarray(totals["mean"], float), np.asarray(totals["cov"], float)
        rho = float(tm[1] / tm[0])
        var = tc[1, 1] - 2 * rho * tc[0, 1] + rho**2 * tc[0, 0]
        se = math.sqrt(max(var, 0.0)) / float(tm[0])
        row = {"position": "total", "observed": overall, "accepted": accepted, "expected": rho, "se": se,
               "z": (overall - rho) / se if se > 0 else float("inf"), "expected_draft_tokens": float(tm[0])}
        out.update(expected_acceptance_per_token=rho, totals=row)
        if row["z"] < -tolerance:
            failing.append(row)
        if exp.get("rejection_acceptance_per_token") is not None:
            out["rejection_acceptance_per_token"] = float(exp["rejection_acceptance_per_token"])
    out["failing"] = failing
    out["passed"] = not failing if (exp is not None or rates is not None) else None
    if out["passed"] is None:
        out["verdict"] = "no exact expectation for this scheme (observed only)"
    elif failing:
        out["verdict"] = "FAILS efficiency: " + "; ".join(
            f"{'position %s' % r['position'] if r['position'] != 'total' else 'per draft token'}: "
            f"{r['observed']:.4f} < exact {r['expected']:.4f} ({r['z']:.1f} SE)" for r in failing)
    else:
        out["verdict"] = "matches the exact expectation"
    if totals is not None:
        t = out["totals"]
        out["verdict"] += f" (per draft token {t['observed']:.4f} vs exact {t['expected']:.4f}, z {t['z']:+.1f}"
        if out.get("rejection_acceptance_per_token") is not None:
            out["verdict"] += (f"; token-wise rejection sampling with the draft's law would accept "
                               f"{out['rejection_acceptance_per_token']:.4f}")
        out["verdict"] += ")"
    return out


# ----------------------------------------------------------------------------- sample-and-match (llama.cpp)


def draft_path(draft_logits: np.ndarray, start: int, n: int, p_min: float = 0.0) -> list[int]:
    """The deterministic draft of llama.cpp's ``draft-simple`` from last token ``start`` on an order-1 draft:
    argmax of the raw draft logits, extended while its confidence ``softmax(logits)[argmax] >= p_min``, at most
    ``n`` tokens. Raises if a row's argmax is tied (the draft would not be determined)."""
    z = np.asarray(draft_logits, dtype=np.float64)
    conf = np.exp(z - z.max(1, keepdims=True))
    conf = conf.max(1) / conf.sum(1)
    path, last = [], int(start)
    for _ in range(n):
        row = z[last]
        if (row == row.max()).sum() > 1:
            raise ValueError(f"draft row {last} has a tied argmax: llama.cpp's draft is not determined")
        if conf[last] < p_min:
            break
        last = int(row.argmax())
        path.append(last)
    return path


def sample_match_round(p: np.ndarray, path: list[int], start: int) -> np.ndarray:
    """``P[m, y]`` of one sample-and-match round with drafts ``path`` from last token ``start`` (order-1 target
    rows ``p``): the target samples ``y_j ~ p[ctx_j]``; ``m`` drafts equal their samples, then ``y`` is the first
    differing sample (``y != d_{m+1}``) or, all accepted, the bonus sample after ``d_L``."""
    L, vocab = len(path), p.shape[1]
    out = np.zeros((L + 1, vocab))
    reach, ctx = 1.0, int(start)
    for j, d in enumerate(path):
        miss = p[ctx].copy()
        miss[d] = 0.0
        out[j] = reach * miss
        reach *= p[ctx, d]
        ctx = d
    out[L] = reach * p[ctx]
    return out


def variable_moments(p: np.ndarray, round_of, length_of, k: int, max_new_tokens: int):
    """Moments of ``X = (drafts, accepted_per_pos[0..k-1], draft_tokens, accepted)`` over the rest of one request,
    per state ``(a, r)`` (last token, tokens still to emit): ``mean[a, r]``, ``second[a, r]``. ``length_of(a, r)``:
    the round's draft length (0: one plain target step ``y ~ p[a]``, nothing counted); ``round_of(a, L)``: its
    outcome law ``P[m, y]``."""
    vocab = p.shape[0]
    dim = 1 + k + 2
    mean = np.zeros((vocab, max_new_tokens + 1, dim))
    second = np.zeros((vocab, max_new_tokens + 1, dim, dim))
    for r in range(1, max_new_tokens + 1):
        for a in range(vocab):
            L = int(length_of(a, r))
            if L == 0:
                outcomes = [(np.zeros(dim), p[a], 1)]
            else:
                law = round_of(a, L)
                outcomes = []
                for m in range(L + 1):
                    x = np.zeros(dim)
                    x[0], x[1:1 + min(m, k)], x[1 + k], x[2 + k] = 1.0, 1.0, L, m
                    outcomes.append((x, law[m], m + 1))
            mu, s2 = np.zeros(dim), np.zeros((dim, dim))
            for x, w, used in outcomes:
                left = r - used
                for y in np.flatnonzero(w > 0):
                    nm = mean[y, left] if left > 0 else 0.0
                    ns = second[y, left] if left > 0 else 0.0
                    mu += w[y] * (x + nm)
                    s2 += w[y] * (np.outer(x, x) + np.outer(x, nm) + np.outer(nm, x) + ns)
            mean[a, r], second[a, r] = mu, s2
    return mean, second


def _totals(p, mean, second, prompts_last, max_new_tokens: int, prefill: bool):
    dim = mean.shape[-1]
    tot_mean, tot_cov = np.zeros(dim), np.zeros((dim, dim))
    for b, count in zip(*np.unique(np.asarray(prompts_last), return_counts=True)):
        if prefill:
            w = p[b]
            mu = (w[:, None] * mean[:, max_new_tokens - 1]).sum(0) if max_new_tokens > 1 else np.zeros(dim)
            s2 = (w[:, None, None] * second[:, max_new_tokens - 1]).sum(0) if max_new_tokens > 1 else np.zeros((dim, dim))
        else:
            mu, s2 = mean[b, max_new_tokens], second[b, max_new_tokens]
        tot_mean += count * mu
        tot_cov += count * (s2 - np.outer(mu, mu))
    return tot_mean, tot_cov


def sample_match_expected(pair_name: str, temperature: float, n_max: int, prompts_last, max_new_tokens: int, *,
                          prefill: bool = True, p_min: float = 0.0, n_min: int = 0) -> dict:
    """Exact per-request totals of llama.cpp's ``draft-simple`` (see the module docstring) on an order-1 pair at
    temperature-only sampling: ``mean`` / ``cov`` of ``(drafts, accepted_per_pos[0..n_max-1])`` (the layout of
    :func:`expected`), ``totals`` (``(draft_tokens, accepted)``), and ``rejection_acceptance_per_token``: the
    acceptance per draft token of token-wise rejection sampling with drafts drawn from ``softmax(draft / T)``
    on rounds of the same lengths (``min(n_max, r - 1)``)."""
    from specdec_ref.exact import exact_pair
    from specdec_ref.warp import SamplingConfig

    k = int(n_max)
    sampling = SamplingConfig(temperature=temperature)
    token_pair, oracle = tables(pair_name, sampling, "token")
    p = token_pair.target
    raw_q = np.asarray(exact_pair(pair_name).draft.next_logits([[a] for a in range(p.shape[0])]), dtype=np.float64)
    paths = {a: draft_path(raw_q, a, k, p_min) for a in range(p.shape[0])}

    def length(a, r):
        L = min(len(paths[a]), r - 1)
        return 0 if L < max(n_min, 1) else L

    mean, second = variable_moments(p, lambda a, L: sample_match_round(p, paths[a][:L], a), length, k, max_new_tokens)
    tm, tc = _totals(p, mean, second, prompts_last, max_new_tokens, prefill)
    laws = {}

    def token_round(a, L):
        if (a, L) not in laws:
            laws[(a, L)] = round_law(token_pair, oracle, a, L)
        return laws[(a, L)]

    rmean, rsecond = variable_moments(p, token_round, lambda a, r: min(k, r - 1), k, max_new_tokens)
    rm, _ = _totals(p, rmean, rsecond, prompts_last, max_new_tokens, prefill)
    pos = list(range(0, 1 + k))
    return {"mean": tm[pos], "cov": tc[np.ix_(pos, pos)], "n": len(list(prompts_last)),
            "totals": {"mean": tm[[1 + k, 2 + k]], "cov": tc[np.ix_([1 + k, 2 + k], [1 + k, 2 + k])]},
            "rejection_acceptance_per_token": float(rm[2 + k] / rm[1 + k]) if rm[1 + k] > 0 else None}


@functools.lru_cache(maxsize=None)
def expectation_for(pair_name: str, scheme: str, temperature: float, k: int, prompts_last: tuple[int, ...],
                    max_new_tokens: int, prefill: bool = True) -> dict:
    """:func:`expected` for a configuration's scheme, cached (lists, JSON-ready)."""
    from specdec_ref.warp import SamplingConfig

    if scheme == "sample_match":  # llama.cpp's draft-simple at its defaults p_min = 0, n_min = 0
        e = sample_match_expected(pair_name, temperature, k, prompts_last, max_new_tokens, prefill=prefill)
        return {"mean": e["mean"].tolist(), "cov": e["cov"].tolist(), "n": e["n"],
                "totals": {"mean": e["totals"]["mean"].tolist(), "cov": e["totals"]["cov"].tolist()},
                "rejection_acceptance_per_token": e["rejection_acceptance_per_token"]}
    pair, oracle = tables(pair_name, SamplingConfig(temperature=temperature), scheme)
    e = expected(pair, oracle, k, list(prompts_last), max_new_tokens, prefill=prefill)
    return {"mean": e["mean"].tolist(), "cov": e["cov"].tolist(), "n": e["n"]}
