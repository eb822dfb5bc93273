"""The log-probabilities an engine returns, checked token by token against the exactly-known model.

A case that asks for log-probabilities (:attr:`conformance.engines.matrix.Case.logprobs` = n) gets, per returned
token, the engine's log-probability of that token and of its top n, and, where the engine gives them, of each prompt
token after the one before it. Each is compared with the exact value at the same prefix (``prompt + completion[:i]``):
deterministic, no statistics; a departure larger than :data:`TOLERANCE` nats fails. Which distribution is meant is the
engine's declared convention (:attr:`conformance.engines.adapter.Conventions.logprobs`):

* ``raw``: the log-softmax of the target's logits, before any of the request's settings (vLLM's default
  ``logprobs_mode``, llama-server's ``n_probs`` without ``post_sampling_probs``);
* ``processed``: the log of the law the token is sampled from (history settings, temperature, filters: a filtered
  token is ``-inf``).

Prompt log-probabilities are raw under either convention. The top n must be the n most likely tokens of that
distribution (a token tied with the n-th within the tolerance may stand for it).

A failure names what it looks like where the pattern is one a known bug leaves: no log-probabilities at all,
log-probability 0 (probability 1, "not computed") for the tokens, the values of the neighbouring position (an
off-by-one prefix), or the other convention's values; and the positions where it happens (say the drafted tokens
only, the first token from prefill being right).
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable

import numpy as np
from ..report import show_ids

__all__ = ["TOLERANCE", "CONVENTIONS", "logprob_check", "exact_rows", "bug_effects"]

#: Absolute tolerance, in nats. Engines compute in float32 over a vocabulary of 8-9: their log-softmax is within 1e-5
#: of the float64 tables; the plausible bugs the check is built for move a value by far more (the ``logprobs`` case's
#: smallest effects are stated in docs/request-features.md).
TOLERANCE = 1e-3
#: Log-probabilities below this are "impossible" on both sides (an engine writes -inf, -1e30 or -9999).
_FLOOR = -50.0
CONVENTIONS = ("raw", "processed")


def exact_rows(model, prompt, prefixes, sampling, convention: str, eos_id=None) -> np.ndarray:
    """float64 ``[len(prefixes), V]`` log-probabilities after ``prompt + prefix`` under ``convention``."""
    import torch

    from specdec_properties.sequences import next_logits64, next_token_law

    if convention not in CONVENTIONS:
        raise ValueError(f"logprob convention must be one of {CONVENTIONS}, got {convention!r}")
    prompt = [int(t) for t in prompt]
    if convention == "raw":
        rows = torch.log_softmax(next_logits64(model, [prompt + list(p) for p in prefixes]), dim=-1)
    else:
        with np.errstate(divide="ignore"):
            return np.log(next_token_law(model, prompt, prefixes, sampling, eos_id=eos_id).numpy())
    return rows.numpy()


def _same(a: float, b: float) -> bool:
    if a <= _FLOOR and b <= _FLOOR:
        return True
    return abs(a - b) <= TOLERANCE


class _Table:
    """Exact rows by prefix, computed once per distinct prefix."""

    def __init__(self, model, prompt, sampling, convention, eos_id):
        self.model, self.prompt, self.sampling, self.convention, self.eos_id = model, prompt, sampling, convention, eos_id
        self.rows: dict[tuple[int, ...], np.ndarray] = {}

    def __call__(self, prefix: tuple[int, ...], convention: str | None = None) -> np.ndarray:
        conv = convention or self.convention
        key = (conv,) + prefix
        if key not in self.rows:
            self.rows[key] = exact_rows(self.model, self.prompt, [prefix], self.sampling, conv, self.eos_id)[0]
        return self.rows[key]


def _row_or_none(table, prefix, token):
    try:
        return table(prefix)[token]
    except ValueError:  # an impossible token in the prefix
        return None


def _entries(position) -> dict[int, float]:
    return {int(t): float(v) for t, v in (position or {}).items()}


def _top_ok(got: dict[int, float], row: np.ndarray, n: int) -> str | None:
    """None when the returned tokens hold the row's n most likely (ties within the tolerance may stand in)."""
    finite = [t for t in range(len(row)) if row[t] > _FLOOR]
    want = min(n, len(finite))
    order = sorted(finite, key=lambda t: -row[t])
    if want == 0:
        return None
    nth = row[order[want - 1]]
    missing = [t for t in order if row[t] > nth + TOLERANCE and t not in got]
    if len(got) < want:
        return f"returned {len(got)} of the top {want} asked"
    if missing:
        return f"token {missing[0]} (exact {row[missing[0]]:.4f}) missing from the top {n}"
    return None


def _explain(bad: list[dict]) -> str:
    """What the wrong values look like, where one pattern explains them all."""
    if all(b["kind"] == "missing" for b in bad):
        return "no log-probabilities returned for these tokens"
    values = [b for b in bad if b["kind"] == "value"]
    if values and all(abs(b["got"]) <= TOLERANCE for b in values):
        return "log-probability 0 (probability 1) returned: not computed for these tokens"
    for name, key in (("the previous position's", "prev"), ("the next position's", "next"), ("the other convention's", "other")):
        if values and all(b.get(key) is not None and _same(b["got"], b[key]) for b in values):
            return f"the values are {name} (same token)"
    if values and all(b.get("another") is not None for b in values):
        return ("each value is another token's at the same position (the returned token's replaced by, say, the "
                "token the engine sampled itself where it returned a draft)")
    return ""


def _positions(counter: Counter) -> str:
    return ", ".join(f"{p}: {c}" for p, c in sorted(counter.items()))


def logprob_check(case, lines: Iterable[dict], convention: str, top: bool = True):
    """The :class:`conformance.engines.verdict.Check` of a case's returned log-probabilities (its JSONL lines);
    None when the case asks for none. ``top`` False: the engine returns no top list (only the returned token's
    value is checked, and the check says so)."""
    from specdec_ref.exact import exact_model

    from .verdict import Check

    if not case.logprobs:
        return None
    model = exact_model(case.model)
    eos = int(model.eos_id) if case.eos else None
    other = "processed" if convention == "raw" else "raw"
    tables: dict[tuple[int, ...], _Table] = {}
    prompt_rows: dict[tuple[int, ...], np.ndarray] = {}
    bad: list[dict] = []
    checked = Counter()
    wrong = Counter()
    prompt_checked = prompt_wrong = skipped = 0
    first = None
    for n_line, line in enumerate(lines):
        prompt = tuple(int(t) for t in line["prompt_ids"])
        toks = [int(t) for t in line["completion_ids"]]
        table = tables.setdefault(prompt, _Table(model, prompt, case.sampling, convention, eos))
        lps = line.get("logprobs")
        for i, tok in enumerate(toks):
            try:
                row = table(tuple(toks[:i]))
            except ValueError:  # the prefix holds a token the model cannot produce (the law's check names it): the
                skipped += len(toks) - i  # rest of the line has no exact values
                break
            checked[i + 1] += 1
            got = _entries(lps[i]) if lps is not None and i < len(lps) else {}
            problem = None
            if tok not in got:
                problem = {"kind": "missing", "text": f"no log-probability for the returned token {tok}"}
            else:
                off = next((t for t, v in got.items() if not (0 <= t < len(row)) or not _same(v, float(row[t]))), None)
                if off is not None and not 0 <= off < len(row):
                    problem = {"kind": "range", "text": f"log-probability for token {off}, outside the vocabulary"}
                elif off is not None:
                    twin = next((t for t in range(len(row)) if t != off and _same(got[off], float(row[t]))), None)
                    neighbours = {"prev": table(tuple(toks[:i - 1]))[off] if i >= 1 else None,
                                  "next": _row_or_none(table, tuple(toks[:i + 1]), off) if i + 1 < len(toks) else None,
                                  "other": table(tuple(toks[:i]), other)[off]}
                    problem = {"kind": "value", "got": got[off], "token": off, "another": twin,
                               **{k: (None if v is None else float(v)) for k, v in neighbours.items()},
                               "text": f"token {off}: {got[off]:.4f}, exact {row[off]:.4f}"}
                else:
                    missed = _top_ok(got, row, case.logprobs) if top else None
                    problem = None if missed is None else {"kind": "top", "text": missed}
            if problem is not None:
                wrong[i + 1] += 1
                problem["position"] = i + 1
                bad.append(problem)
                first = first or (f"request seed {line.get('seed')} (line {n_line + 1}), position {i + 1} after "
                                  f"{show_ids(prompt)} + {toks[:i]}: {problem['text']}")
        plps = line.get("prompt_logprobs")
        if plps is not None:
            for j in range(1, len(prompt)):
                prompt_checked += 1
                got = _entries(plps[j]) if j < len(plps) else {}
                ctx = prompt[:j]
                if ctx not in prompt_rows:
                    prompt_rows[ctx] = exact_rows(model, ctx, [()], case.sampling, "raw")[0]
                ref = prompt_rows[ctx]
                tok = prompt[j]
                if tok not in got or not _same(got[tok], float(ref[tok])):
                    prompt_wrong += 1
                    first = first or (f"request seed {line.get('seed')} (line {n_line + 1}), prompt token {j + 1} "
                                      f"({tok}): {got.get(tok, 'none')}, exact {ref[tok]:.4f}")
    total = sum(checked.values())
    if total == 0:
        return Check(None, "no returned tokens to check", {})
    detail = {"tokens": total, "wrong": sum(wrong.values()), "by_position": {str(p): [wrong[p], checked[p]] for p in checked},
              "prompt_tokens": prompt_checked, "prompt_wrong": prompt_wrong, "skipped": skipped, "tolerance": TOLERANCE,
              "convention": convention}
    if not bad and not prompt_wrong:
        what = f"and top {case.logprobs}" if top else "(no top list: the engine returns none)"
        text = (f"{total} returned tokens' log-probabilities {what} ({convention}) within "
                f"{TOLERANCE:g} nats" + (f"; {prompt_checked} prompt tokens' too" if prompt_checked else
                                         "; no prompt log-probabilities returned")
                + (f"; {skipped} tokens after an impossible token not checked" if skipped else ""))
        return Check(True, text, detail)
    why = _explain(bad) if bad else ""
    wrong_at = [p for p in sorted(checked) if wrong[p]]
    right_at = [p for p in sorted(checked) if not wrong[p]]
    text = (f"logprobs wrong on {sum(wrong.values())} of {total} tokens (wrong/checked by position "
            f"{_positions(Counter({p: f'{wrong[p]}/{checked[p]}' for p in checked}))})"
            + (f"; right at position {', '.join(map(str, right_at))}" if right_at and wrong_at else "")
            + (f"; {prompt_wrong} of {prompt_checked} prompt tokens wrong" if prompt_wrong else "")
            + (f"; {skipped} tokens after an impossible token not checked" if skipped else "")
            + (f": {why}" if why else "") + f"; first: {first}")
    detail["explained"] = why or None
    detail["summary"] = (f"logprobs wrong on {sum(wrong.values())} of {total} tokens"
                         + (f" (positions {', '.join(map(str, wrong_at))}; right at {', '.join(map(str, right_at))})"
                            if right_at and wrong_at else "")
                         + (f", {prompt_wrong} prompt tokens" if prompt_wrong else "") + f": {why or first}")
    return Check(False, text, detail)


def bug_effects(case, convention: str = "raw") -> dict[str, dict]:
    """What each named bug does to the case's returned log-probabilities, under the exact law of its completions:
    ``share``, the probability that a completion has a token whose value the bug moves by more than ten times
    :data:`TOLERANCE` (one such completion fails the check), and ``median``, the median move over its tokens (nats).
    Bugs: 0 returned, the previous position's value of the same token, the other convention's value."""
    from specdec_properties.sequences import continuation_law
    from specdec_ref.exact import exact_model

    model = exact_model(case.model)
    eos = int(model.eos_id) if case.eos else None
    law = continuation_law(model, list(case.prompt), case.max_new_tokens, case.sampling, eos_id=eos)
    table = _Table(model, tuple(case.prompt), case.sampling, convention, eos)
    other = "processed" if convention == "raw" else "raw"
    moves: dict[str, list[float]] = {"zero": [], "previous position": [], "other convention": []}
    share = dict.fromkeys(moves, 0.0)
    for seq, p in law.items():
        seq = [int(t) for t in seq]
        worst = dict.fromkeys(moves, 0.0)
        for i, tok in enumerate(seq):
            v = float(table(tuple(seq[:i]))[tok])
            here = {"zero": abs(v), "other convention": abs(v - float(table(tuple(seq[:i]), other)[tok]))}
            if i >= 1:
                here["previous position"] = abs(v - float(table(tuple(seq[:i - 1]))[tok]))
            for name, m in here.items():
                moves[name].append(m)
                worst[name] = max(worst[name], m)
        for name in moves:
            share[name] += float(p) if worst[name] > 10 * TOLERANCE else 0.0
    return {name: {"share": share[name], "median": float(np.median(moves[name]))} for name in moves}
