"""An engine's argmax-draft rounds, reconstructed from its completions, against its own counters (engine-neutral).

With argmax drafts (a one-hot draft: vLLM's default for EAGLE, Medusa, n-gram and ``draft_sample_method="greedy"``)
a round's drafts are a function of its text, and a draft is accepted exactly when it equals the next token of the
completion (a rejected one-hot draft is never the token emitted in its place: the residual ``p - q`` has no mass on
it, and greedy emits the target's argmax, which then differs from it). So from a completion alone every round can
be rebuilt (:func:`reconstruct`): from the text ``h`` (pending token last) the proposer's exact law
(:mod:`specdec_properties.proposals`) gives the drafts ``D``; the round accepts the leading drafts that equal the next
tokens and emits one token more. An engine whose drafter reads the wrong feature, the wrong position or a stale
cache proposes other drafts, and its counters then differ from the reconstruction: :func:`check_rounds` compares
them, in total (``drafts``, ``draft_tokens``, ``accepted_per_pos``) and, where the engine reports each request's
rounds, round by round, naming the first request and round that differ.

Conventions an adapter declares (:class:`~conformance.engines.adapter.Conventions`): ``first_token_at_prefill``
(vLLM: the first token is a plain target sample and rounds start after it), ``drafts_to_end`` and a configuration's
``proposer`` (:func:`proposal_law`). vLLM always proposes the law's full count near ``max_tokens`` and counts the
accepted drafts before the completion is cut, so the last round of a request is *censored* when the text ends
before a draft was rejected: its accepted count is then only bounded, ``[visible, drafts]`` (greedy requests:
settled by the target's argmax chain). The totals must lie within the bounds and equal them where no round is
censored. llama.cpp drafts ``min(k, r - 1)`` with ``r`` tokens still to emit (``drafts_to_end``; none: a plain
step), so its rounds are never cut. The same rebuild serves sample-and-match verification (llama.cpp): an argmax
draft is kept exactly when the target's sample equals it, which is the one-hot draft's acceptance too.

Sampled drafts cannot be rebuilt from a completion, but an engine that reports each request's rounds places them in
it, which is all the conditional expectation needs: :mod:`conformance.engines.sampled_rounds` (a configuration's
``sampled_proposer``).

:func:`conditional_acceptance` is the statistical half: given every reconstructed round's text, the engine's
``accepted_per_pos[i]`` has the exact mean ``sum_rounds P(m >= i | text)``
(:func:`specdec_properties.proposals.round_acceptance` under the declared scheme) and, the rounds being a martingale
sequence, the variance ``sum P (1 - P)``; a position more than :data:`TOLERANCE_SE` standard errors away (either way:
given the texts the law is exact) fails.

Invariant: nothing here imports an engine; the reconstruction reads the exact tables only.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..report import show_ids

__all__ = ["DraftArgmaxLaw", "Round", "proposal_law", "argmax_drafts", "reconstruct", "check_rounds",
           "conditional_acceptance", "rounds_of", "TOLERANCE_SE", "greedy_next"]

TOLERANCE_SE = 5.0


@dataclass(frozen=True)
class DraftArgmaxLaw:
    """The argmax of a draft model (a ``draft_model`` configuration with greedy drafting): draft ``i`` reads the
    draft's law after the text and the drafts before it; with ``sample`` the drafts are samples of its warped law
    instead (a ``token``-scheme configuration's ``sampled_proposer`` ``draft``). A draft whose law reads its last token
    only (the order-1 tables, ``order2-draft``: :func:`_last_token_rows`) is read from one row per token (``context``
    1); any other over the whole text (``context`` None: the long family's draft, which reads the marker)."""

    draft: str
    sample: bool = False
    one_hot = property(lambda self: not self.sample)

    @property
    def context(self) -> int | None:
        return 1 if _last_token_rows(self.draft) is not None else None

    def raw(self, text: Sequence[int], drafts: Sequence[int]) -> np.ndarray:
        rows = _last_token_rows(self.draft)
        if rows is not None:
            return rows[(list(drafts) or list(text))[-1]]
        from specdec_ref.exact import exact_model

        return np.asarray(exact_model(self.draft).next_logits([list(text) + list(drafts)])[0], dtype=np.float64)

    def count(self, text, k):
        return k if len(text) >= 1 else 0

    @property
    def max_positions(self) -> int | None:
        """The contexts the draft's law is defined on, at most (None: read by its last token, at any length)."""
        if self.context is not None:
            return None
        from specdec_ref.exact import exact_model

        return int(exact_model(self.draft).max_positions)


@functools.lru_cache(maxsize=None)
def _last_token_rows(name: str) -> np.ndarray | None:
    """The draft's logits by last token ``[V, V]`` when its law reads the last token only (every reachable cell's row
    is its last token's row), else None."""
    from specdec_ref.exact import exact_model

    m = exact_model(name)
    contexts = m.row_contexts()  # one context per reachable cell
    rows = np.full((m.vocab, m.vocab), np.nan)
    for ctx, row in zip(contexts, np.asarray(m.next_logits(contexts), dtype=np.float64)):
        if np.isnan(rows[ctx[-1], 0]):
            rows[ctx[-1]] = row
        elif not np.array_equal(rows[ctx[-1]], row):
            return None
    return rows


def proposal_law(spec: str, pair_name: str):
    """The exact proposal law a configuration declares (``Configuration.proposer``), on the pair its efficiency set
    runs: ``draft`` (the pair's draft model, argmax), ``exact-eagle`` / ``exact-medusa:H`` (the exactly-known heads
    on the pair's order-1 target, argmax, :mod:`specdec_ref.exact.heads`), ``exact-eagle3`` (the EAGLE-3 head of
    :mod:`specdec_ref.exact.head_files` on the deep target of the same table, whose logits are the target's),
    ``ngram:MIN:MAX`` (prompt lookup)."""
    from specdec_properties.proposals import Eagle3FeatureLaw, EagleLaw, MedusaLaw, NgramLaw
    from specdec_ref.exact.heads import EAGLE3_VOCAB, EAGLE_ALPHA
    from specdec_ref.exact import exact_pair

    pair = exact_pair(pair_name)
    kind, _, rest = spec.partition(":")
    if kind == "draft":
        return DraftArgmaxLaw(pair.draft.name)
    if kind == "exact-eagle":
        return EagleLaw(pair.target.name, EAGLE_ALPHA, False)
    if kind == "exact-medusa":
        return MedusaLaw(pair.target.name, int(rest or 3), False)
    if kind == "exact-eagle3":
        return Eagle3FeatureLaw(pair.target.name, EAGLE3_VOCAB)
    if kind == "ngram":
        lo, _, hi = rest.partition(":")
        return NgramLaw(int(lo), int(hi or lo))
    raise ValueError(f"unknown proposer {spec!r} (draft, exact-eagle, exact-medusa:H, exact-eagle3, ngram:MIN:MAX)")


def argmax_drafts(law, text: Sequence[int], k: int) -> tuple[tuple[int, ...], int]:
    """``(drafts, ties)``: the law's argmax chain from ``text`` (the first maximal index, as ``torch.argmax`` and
    ``numpy.argmax`` take it) and how many of its steps had a tied maximum (their draft is a tie-break)."""
    if hasattr(law, "proposal"):
        return tuple(law.proposal(list(text), k)), 0
    drafts, ties = [], 0
    for _ in range(law.count(list(text), k)):
        row = law.raw(list(text), drafts)
        top = np.sort(row)[-2:]
        ties += int(top[1] - top[0] < 1e-9)
        drafts.append(int(np.argmax(row)))
    return tuple(drafts), ties


@dataclass(frozen=True)
class Round:
    """One reconstructed round: ``request`` (index in the batch), ``start`` (index in ``prompt + completion`` of the
    round's first new token: ``text[:start]`` is its history), its ``drafts``, ``accepted`` (exact, or the visible
    lower bound when ``censored``: the completion ended before a draft was rejected), ``ties`` (tied argmax steps)."""

    request: int
    start: int
    drafts: tuple[int, ...]
    accepted: int
    censored: bool
    ties: int = 0

    @property
    def upper(self) -> int:
        return len(self.drafts) if self.censored else self.accepted


def greedy_next(target_name: str) -> Callable[[int], int]:
    """The argmax after a token of a target whose law reads its last token only (extends a greedy completion of the
    efficiency set, on the order-1 pair, past its cut); ValueError for any other target."""
    rows = _last_token_rows(target_name)
    if rows is None:
        raise ValueError(f"{target_name}: its law reads more than the last token; no argmax by last token")
    return lambda last: int(np.argmax(rows[last]))


class Rounds(list):
    """A request's rebuilt rounds; ``truncated``: they stop before the completion's end, at the first round whose
    drafts the law does not state (``reconstruct(positions=...)``)."""

    truncated = False


def reconstruct(law, prompt: Sequence[int], completion: Sequence[int], k: int, *, prefill: bool = True,
                request: int = 0, extend: Callable[[int], int] | None = None,
                max_new: int | None = None, eos_ends_round: int | None = None,
                context: tuple[int, bool] | None = None, positions: int | None = None) -> Rounds:
    """The rounds of one request (module docstring). ``prefill``: the first token is a plain target sample (no
    round); a text on which the law proposes nothing is a plain target step (no round counted, as vLLM's n-gram
    without a match). ``extend(last) -> next``: the deterministic continuation past the completion's end (greedy
    requests), which settles a censored round; None leaves it censored. ``max_new``: the request's ``max_tokens``
    under ``drafts_to_end`` (a round drafts at most the tokens still to emit but one); None: always ``k``.
    ``eos_ends_round``: the EOS id of an engine whose verifier stops at a drafted EOS the target matched before the
    round's last draft and counts it as the round's own sampled token, not an accepted draft (llama.cpp's
    ``common_sampler_sample_and_accept_n``); at the last draft it is accepted. None: a matched EOS is an accepted draft
    like any other. ``context``: ``(n_ctx, shifts)`` of an engine whose drafts must fit its context
    (``Conventions.drafts_fit_context``): a round drafts at most ``n_ctx - cells - 2`` tokens, ``cells`` the tokens
    before the round's input; with ``shifts``, when ``cells + 1 >= n_ctx`` half the cells are discarded first
    (llama-server's context shift, ``n_keep`` 0). ``positions``: the contexts the law is defined on, at most; the rounds
    stop (``truncated``) at the first whose drafts would read more (an engine that drafts past the context's end)."""
    text = list(prompt) + list(completion)
    pos = len(prompt) + (1 if prefill and completion else 0)
    rounds, discarded = Rounds(), 0
    while pos < len(text):
        room = k if max_new is None else min(k, len(prompt) + max_new - pos - 1)
        if context is not None:
            n_ctx, shifts = context
            cells = pos - 1 - discarded
            if shifts and cells + 1 >= n_ctx:
                discarded += max(0, min(cells // 2, cells - 1))
                cells = pos - 1 - discarded
            room = min(room, n_ctx - cells - 2)
        if positions is not None and room > 0 and pos + room - 1 > positions:
            rounds.truncated = True
            break
        drafts, ties = argmax_drafts(law, text[:pos], room) if room > 0 else ((), 0)
        if not drafts:
            pos += 1
            continue
        m = 0
        while m < len(drafts) and pos + m < len(text) and text[pos + m] == drafts[m]:
            m += 1
        censored = m < len(drafts) and pos + m >= len(text)
        ends = [j for j in range(m) if drafts[j] == eos_ends_round and pos + j == len(text) - 1]
        if ends:  # the completion ends at a matched, drafted EOS: the engine's count is exact
            m, censored = (ends[0] if ends[0] + 1 < len(drafts) else len(drafts)), False
        if censored and extend is not None:
            last = text[-1]
            while m < len(drafts):
                last = extend(last)
                if last != drafts[m]:
                    break
                m += 1
            censored = False
        rounds.append(Round(request, pos, drafts, m, censored, ties))
        pos += m + 1
    return rounds


def _totals(rounds: Sequence[Round], k: int) -> dict:
    lo, hi = np.zeros(k, dtype=int), np.zeros(k, dtype=int)
    for r in rounds:
        lo[:min(r.accepted, k)] += 1
        hi[:min(r.upper, k)] += 1
    return {"drafts": len(rounds), "draft_tokens": sum(len(r.drafts) for r in rounds),
            "accepted_per_pos": lo.tolist(), "accepted_per_pos_upper": hi.tolist(),
            "censored": sum(r.censored for r in rounds), "tied": sum(r.ties > 0 for r in rounds)}


def check_rounds(law, records: Sequence[dict], k: int, *, prefill: bool, counters: dict | None,
                 extend: Callable[[int], int] | None = None, max_new: int | None = None,
                 eos_ends_round: int | None = None, context: tuple[int, bool] | None = None,
                 positions: int | None = None) -> dict:
    """The engine's counters (and per-request rounds where each record has ``rounds``: ``[[drafted, accepted], ...]``
    in order; else per-request totals where each has ``draft_tokens`` and ``accepted``) against the rounds rebuilt
    from the records' ``prompt_ids`` / ``completion_ids`` (``max_new``, ``positions``: see :func:`reconstruct`; a
    request's rounds past ``positions`` are not compared). ``passed`` False on the first difference, with ``text``
    naming it; None when the engine reports nothing to compare."""
    rounds: list[Round] = []
    first = None
    differing = leading = 0  # requests whose rounds differ; of them, those equal past a leading (k, 0) round
    cut = 0  # requests whose rounds are compared up to ``positions`` only
    per_request = all("rounds" in r for r in records) and bool(records)
    totals = not per_request and bool(records) and all("draft_tokens" in r and "accepted" in r for r in records)
    for i, rec in enumerate(records):
        mine = reconstruct(law, rec["prompt_ids"], rec["completion_ids"], k, prefill=prefill, request=i, extend=extend,
                           max_new=max_new, eos_ends_round=eos_ends_round, context=context, positions=positions)
        rounds.extend(mine)
        cut += mine.truncated
        if mine.truncated and not per_request:
            continue  # a request's totals cannot be compared with part of its rounds
        if per_request:
            engine = [tuple(int(x) for x in step) for step in rec["rounds"]]
            engine = engine[:len(mine)] if mine.truncated else engine
            bad = _first_difference(mine, engine)
            if bad is not None:
                differing += 1
                leading += engine[:1] == [(k, 0)] and _first_difference(mine, engine[1:]) is None
                if first is None:
                    first = _describe(i, rec, mine, engine, bad)
        elif totals and first is None:
            first = _totals_difference(i, rec, mine)
    total = _totals(rounds, k)
    out = {"reconstructed": total, "rounds": rounds, "per_request": per_request, "requests": len(records)}
    problems = []
    if counters is not None and not cut:
        out["engine"] = {key: counters.get(key) for key in ("drafts", "draft_tokens", "accepted", "accepted_per_pos")}
        for key in ("drafts", "draft_tokens"):
            if counters.get(key) is not None and int(counters[key]) != total[key]:
                problems.append(f"{key}: engine {counters.get(key)}, reconstructed {total[key]}")
        pos = counters.get("accepted_per_pos")
        if pos is None and counters.get("accepted") is not None:
            lo, hi = sum(total["accepted_per_pos"]), sum(total["accepted_per_pos_upper"])
            if not lo <= int(counters["accepted"]) <= hi:
                problems.append(f"accepted: engine {counters['accepted']}, reconstructed "
                                + (f"{lo}" if lo == hi else f"{lo}..{hi}"))
        if pos is not None:
            for j in range(k):
                lo, hi = total["accepted_per_pos"][j], total["accepted_per_pos_upper"][j]
                if not lo <= int(pos[j]) <= hi:
                    problems.append(f"accepted at position {j + 1}: engine {pos[j]}, reconstructed "
                                    + (f"{lo}" if lo == hi else f"{lo}..{hi}"))
    elif not per_request and not (totals and cut < len(records)):
        out.update(passed=None, text="the engine reports no counters to compare with the reconstruction")
        return out
    if first is not None:
        if differing and leading == differing:
            first += (f" (all {differing} differing requests: the engine counts one round more, first, {k} drafted and "
                      "0 accepted, and every later round equals the rebuilt ones: the step that sampled the first token "
                      "counted as a round of placeholder drafts)")
        elif differing > 1:
            first += f" ({differing} requests differ; {leading} of them only by a leading round of {k} drafted, 0 accepted)"
        problems.insert(0, first)
    where = "totals" + (" and every request's rounds" if per_request else " and every request's totals" if totals else "")
    bounds = (f"; {total['censored']} rounds cut by max_tokens before a rejection, counted within their bounds"
              if total["censored"] else "")
    if cut:
        bounds += (f"; {cut} requests compared up to their first round whose drafts would read more than the draft's "
                   f"{positions} positions (no draft law there; the engine-wide counters not compared)")
    if problems:
        out.update(passed=False, text="DIFFERS from the rounds rebuilt from the completions: " + "; ".join(problems))
    else:
        out.update(passed=True, text=f"{where} equal the {total['drafts']} rounds rebuilt from {len(records)} "
                                     f"completions ({total['draft_tokens']} drafts){bounds}")
    out["problems"] = problems
    return out


def _totals_difference(i: int, rec: dict, mine: Sequence[Round]) -> str | None:
    """A request whose own ``draft_tokens`` / ``accepted`` totals differ from its rebuilt rounds' (named), else None."""
    drafted = sum(len(r.drafts) for r in mine)
    lo, hi = sum(r.accepted for r in mine), sum(r.upper for r in mine)
    if int(rec["draft_tokens"]) == drafted and lo <= int(rec["accepted"]) <= hi:
        return None
    seed = rec.get("seed")
    want = f"{lo}" if lo == hi else f"{lo}..{hi}"
    return (f"request {i}" + (f" (seed {seed})" if seed is not None else "") +
            f", prompt {show_ids(rec['prompt_ids'])}, completion {list(rec['completion_ids'])}: the engine counts "
            f"{rec['draft_tokens']} drafts and {rec['accepted']} accepted, the rebuilt rounds "
            f"{[(len(r.drafts), r.accepted) for r in mine]} give {drafted} and {want}")


def _first_difference(mine: Sequence[Round], engine: Sequence[tuple[int, int]]) -> int | None:
    for j in range(max(len(mine), len(engine))):
        if j >= len(mine) or j >= len(engine):
            return j
        r, (drafted, accepted) = mine[j], engine[j]
        if drafted != len(r.drafts) or not r.accepted <= accepted <= r.upper:
            return j
    return None


def _describe(i: int, rec: dict, mine, engine, j: int) -> str:
    seed = rec.get("seed")
    head = f"request {i}" + (f" (seed {seed})" if seed is not None else "") + \
        f", prompt {show_ids(rec['prompt_ids'])}, completion {list(rec['completion_ids'])}: round {j + 1}"
    if j >= len(mine):
        return f"{head}: the engine counts {len(engine)} rounds, the completion has {len(mine)}"
    r = mine[j]
    text = (list(rec["prompt_ids"]) + list(rec["completion_ids"]))[:r.start]
    want = f"{r.accepted}" if not r.censored else f"{r.accepted}..{r.upper}"
    got = "none" if j >= len(engine) else f"{engine[j][1]} of {engine[j][0]}"
    after = (list(rec["prompt_ids"]) + list(rec["completion_ids"]))[r.start:r.start + len(r.drafts) + 1]
    return (f"{head} from text {show_ids(text)}: the law drafts {list(r.drafts)}, the completion continues {after}, so "
            f"{want} accepted; the engine accepted {got}")


def conditional_acceptance(target_name: str, law, records: Sequence[dict], rounds: Sequence[Round], config, k: int,
                           observed_per_pos: Sequence[int] | None, *, scheme=None,
                           tolerance: float = TOLERANCE_SE) -> dict:
    """Per position ``i``: the exact ``E = sum_rounds P(m >= i | text)`` over the reconstructed rounds (the law of one
    round, :func:`specdec_properties.proposals.round_acceptance`, under ``config`` and ``scheme``, default token-wise rejection
    with the one-hot draft), the standard error ``sqrt(sum P (1 - P))``, the engine's count and z. In the layout of
    :func:`conformance.engines.efficiency.compare` (``positions``, ``passed``, ``verdict``)."""
    from specdec_properties.exact import SchemeSpec
    from specdec_properties.history_law import history_settings_on
    from specdec_properties.proposals import round_acceptance, round_key
    from specdec_ref.exact import exact_model

    target = exact_model(target_name)
    scheme = scheme or SchemeSpec(name="token")
    whole_text = history_settings_on(config)  # penalties and the like read the whole history
    memo: dict = {}
    mean, var = np.zeros(k), np.zeros(k)
    for r in rounds:
        rec = records[r.request]
        text = (list(rec["prompt_ids"]) + list(rec["completion_ids"]))[:r.start]
        kr = len(r.drafts)  # k, or fewer where the engine drafts to the end (drafts_to_end)
        # a round's law: the drafts (what the proposer reads), and the target's rows along them, which the cell of the
        # round's text and the drafts fix (order-1: the last token; order-2: the last two and the position's parity)
        key = tuple(text) if whole_text else (round_key(law, text, kr), kr, target.cell(text))
        if key not in memo:
            law_m = round_acceptance(target, law, text, [], config, kr, scheme)
            tail = np.cumsum(law_m[::-1])[::-1]  # P(m >= j)
            memo[key] = np.array([tail[j] if j < len(tail) else 0.0 for j in range(1, k + 1)])
        p = memo[key]
        mean += p
        var += p * (1 - p)
    drafts = len(rounds)
    rows, failing = [], []
    obs = list(observed_per_pos) if observed_per_pos is not None else None
    for j in range(k):
        se = math.sqrt(var[j])
        row = {"position": j + 1, "expected": float(mean[j] / drafts) if drafts else 0.0,
               "se": se / drafts if drafts else 0.0, "expected_count": float(mean[j])}
        if obs is not None:
            row.update(accepted=int(obs[j]), observed=int(obs[j]) / drafts if drafts else 0.0,
                       z=(int(obs[j]) - mean[j]) / se if se > 0 else (0.0 if int(obs[j]) == mean[j] else float("inf")))
            if abs(row["z"]) > tolerance:
                failing.append(row)
        rows.append(row)
    out = {"drafts": drafts, "positions": rows, "tolerance_se": tolerance, "failing": failing,
           "expectation": "conditional on the reconstructed rounds' texts", "distinct_round_starts": len(memo)}
    if obs is None:
        out.update(passed=None, verdict="no per-position counters: the exact expectation is stated, not tested")
    elif failing:
        out.update(passed=False, verdict="FAILS efficiency: " + "; ".join(
            f"position {r['position']}: {r['observed']:.4f} vs exact {r['expected']:.4f} ({r['z']:+.1f} SE)"
            for r in failing))
    else:
        out.update(passed=True, verdict="matches the exact expectation given the rounds' texts")
    if drafts:
        total = sum(int(x) for x in obs) if obs is not None else None
        out["acceptance_per_token"] = None if total is None else total / max(sum(len(r.drafts) for r in rounds), 1)
        out["expected_acceptance_per_token"] = float(mean.sum() / max(sum(len(r.drafts) for r in rounds), 1))
    return out


def rounds_of(ad, cfg, state: dict) -> dict | None:
    """The runner's half (any adapter): for a configuration that declares its ``proposer``, the rounds check on the
    efficiency set's completions (``{"check": ...}``) and, for proposers other than the pair's draft model, the
    efficiency verdict given those rounds (``{"efficiency": ...}``; the draft model keeps the unconditional
    expectation of :mod:`conformance.engines.efficiency`). None when there is nothing to rebuild from."""
    import json
    from pathlib import Path

    from specdec_ref.exact import exact_pair

    from .matrix import EFFICIENCY

    eff = state.get("efficiency")
    if cfg.proposer is None or not cfg.speculative or not eff or eff.get("status") != "ok" or not eff.get("file"):
        return None
    records = [json.loads(line) for line in Path(eff["file"]).read_text().splitlines()]
    pair_name = ad.families[EFFICIENCY.family]
    target = exact_pair(pair_name).target.name
    law, k = proposal_law(cfg.proposer, pair_name), ad.k_of(cfg)
    engine_counters = eff.get("counters_source") == "engine"
    counters = {key: eff.get(key) for key in ("drafts", "draft_tokens", "accepted", "accepted_per_pos")}
    if not engine_counters:  # per-request totals count requests, not rounds: only the draft and accepted totals
        counters = {"draft_tokens": eff.get("draft_tokens"), "accepted": eff.get("accepted")} \
            if eff.get("counters_source") == "per-request" else None
    extend = greedy_next(target) if EFFICIENCY.sampling.greedy else None
    max_new = EFFICIENCY.max_new_tokens if ad.conventions.drafts_to_end else None
    check = check_rounds(law, records, k, prefill=ad.conventions.first_token_at_prefill, counters=counters,
                         extend=extend, max_new=max_new)
    rounds = check.pop("rounds")
    out = {"check": {**check, "proposer": cfg.proposer}, "efficiency": None}
    if cfg.proposer.partition(":")[0] != "draft" and rounds:
        e = conditional_acceptance(target, law, records, rounds, EFFICIENCY.sampling, k,
                                   (counters or {}).get("accepted_per_pos"))
        e.update(scheme=cfg.scheme, n_requests=eff["n"], seconds=eff.get("seconds"),
                 counters_source=eff.get("counters_source"), draft_tokens=eff.get("draft_tokens"),
                 accepted=eff.get("accepted"))
        if engine_counters:
            e["drafts"] = eff.get("drafts")
        out["efficiency"] = e
    return out


def case_rounds(ad, cfg, case, info: dict) -> dict | None:
    """The rounds check on one case's completions (a serving condition's: its prompts long, its engine settings its
    own), for a configuration that declares its argmax ``proposer`` and an engine that reports each request's rounds
    (or its drafted and accepted totals): every request's against those rebuilt from its completion
    (:func:`check_rounds`; drafts the engine did not make from the text, such as placeholders near a limit or drafts
    from a stale draft cache, show as a difference). None when there is nothing to compare."""
    import json
    from pathlib import Path

    from specdec_ref.exact import exact_model

    if cfg.proposer is None or not cfg.speculative or info.get("status") != "ok" or not info.get("file"):
        return None  # sampled drafts: conformance.engines.sampled_rounds.sampled_case_rounds
    records = [json.loads(line) for line in (Path(info["dir"]) / info["file"]).read_text().splitlines()]
    reported = all("rounds" in r for r in records) or all("draft_tokens" in r and "accepted" in r for r in records)
    if not records or not reported:
        return None
    law = proposal_law(cfg.proposer, ad.families[case.family])
    eos = int(exact_model(case.model).eos_id) if case.eos and ad.conventions.eos_draft == "target" else None
    context, skipped = None, 0
    if case.condition is not None:
        from .conditions import condition

        settings = condition(case.condition).settings
        if ad.conventions.drafts_fit_context and "max_model_len" in settings:
            context = (int(settings["max_model_len"]), bool(settings.get("context_shift")))
        if "draft_max_model_len" in settings:  # no draft law past the draft's positions: those requests are not compared
            limit = int(settings["draft_max_model_len"])
            fits = [r for r in records if len(r["prompt_ids"]) + case.max_new_tokens + ad.k_of(cfg) <= limit]
            skipped, records = len(records) - len(fits), fits
            if not records:
                return None
    # a draft that reads the whole text has no law past its model's positions: an engine that may draft past the
    # context's end is compared up to the first round that would
    positions = getattr(law, "max_positions", None) if context is None else None
    check = check_rounds(law, records, ad.k_of(cfg), prefill=ad.conventions.first_token_at_prefill, counters=None,
                         max_new=case.max_new_tokens if ad.conventions.drafts_to_end else None, eos_ends_round=eos,
                         context=context, positions=positions)
    check.pop("rounds")
    if skipped:
        check["text"] += f" ({skipped} requests past the draft's {limit} positions not compared: no draft law there)"
    return check
