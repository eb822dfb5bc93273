"""Sampled-draft rounds as the engine reports them, placed in its completions (engine-neutral).

Sampled drafts cannot be rebuilt from a completion (:mod:`conformance.engines.rounds` rebuilds argmax drafts), but an
engine that reports each request's rounds (``[drafted, accepted]``) places them in it: the first round starts after
the prompt (and the first token when it is sampled at prefill), a round that accepts ``m`` drafts emits ``m + 1``
tokens (:func:`engine_rounds`). Given each round's text the accepted drafts per position have an exact mean and
variance (:func:`conformance.engines.rounds.conditional_acceptance`, the proposer's law sampled under the request's
settings); a configuration that declares its ``sampled_proposer`` is checked that way on its efficiency set
(:func:`sampled_rounds_of`, with the engine's counters against the rounds) and on every serving-condition case it
runs (:func:`sampled_case_rounds`).

Invariant: nothing here imports an engine.
"""
from __future__ import annotations

from typing import Sequence

from ..report import show_ids
from .rounds import Round, conditional_acceptance, proposal_law

__all__ = ["engine_rounds", "sampled_rounds_of", "sampled_case_rounds"]


def engine_rounds(records: Sequence[dict], *, prefill: bool) -> tuple[list[Round], str | None]:
    """The rounds an engine reports per request (``rec["rounds"] = [[drafted, accepted], ...]``) placed in each
    completion: the first starts after the prompt (and the first token when ``prefill``), each emits ``accepted + 1``
    tokens; a round with nothing drafted is a plain step (one token, no round). ``(rounds, problem)``: ``problem``
    names the first request whose rounds do not fit its completion (a round starting past its end, or rounds that end
    before it), else None. Drafts are unknown (sampled): ``drafts`` holds ``drafted`` placeholders (-1)."""
    rounds: list[Round] = []
    for i, rec in enumerate(records):
        text = list(rec["prompt_ids"]) + list(rec["completion_ids"])
        start = len(rec["prompt_ids"]) + (1 if prefill else 0)
        reported = rec.get("rounds")
        where = f"request {i} (prompt {show_ids(rec['prompt_ids'])})"
        if reported is None:
            return rounds, f"{where} has no per-request rounds"
        for j, (drafted, accepted) in enumerate(reported):
            if start >= len(text):
                return rounds, f"{where}: round {j + 1} of {len(reported)} starts at {start}, past its text of {len(text)} tokens"
            if drafted:  # censored: the completion ends before every accepted draft shows
                rounds.append(Round(i, start, (-1,) * int(drafted), int(accepted),
                                    censored=len(text) - start < accepted))
            start += int(accepted) + 1
        if start < len(text):
            return rounds, f"{where}: its rounds end at token {start} of a text of {len(text)} (prompt and completion)"
    return rounds, None


def sampled_rounds_of(ad, cfg, state: dict) -> dict | None:
    """The runner's half for a configuration that declares a ``sampled_proposer``: the efficiency set's rounds as the
    engine reports them (:func:`engine_rounds`), their totals against its counters, and the acceptance per position
    against the exact expectation given the rounds' texts, the proposer's law sampled under the efficiency set's
    settings (:func:`conditional_acceptance`). None when there is nothing to place."""
    import json
    from dataclasses import replace
    from pathlib import Path

    from specdec_ref.exact import exact_pair

    from .matrix import EFFICIENCY

    eff = state.get("efficiency")
    if cfg.sampled_proposer is None or not eff or eff.get("status") != "ok" or not eff.get("file"):
        return None
    records = [json.loads(line) for line in Path(eff["file"]).read_text().splitlines()]
    pair_name = ad.families[EFFICIENCY.family]
    law = replace(proposal_law(cfg.sampled_proposer, pair_name), sample=True)
    k = ad.k_of(cfg)
    rounds, problem = engine_rounds(records, prefill=ad.conventions.first_token_at_prefill)
    base = {"scheme": cfg.scheme, "n_requests": eff["n"], "seconds": eff.get("seconds"),
            "counters_source": eff.get("counters_source"), "proposer": f"sampled {cfg.sampled_proposer}"}
    if problem:
        return {**base, "passed": False, "verdict": f"FAILS: the engine's per-request rounds {problem}"}
    per_pos = eff.get("accepted_per_pos")
    mine = {"drafts": len(rounds), "draft_tokens": sum(len(r.drafts) for r in rounds),
            "accepted": sum(r.accepted for r in rounds)}
    differ = [f"{key} {eff.get(key)} counted, {mine[key]} in the per-request rounds" for key in mine
              if eff.get(key) is not None and int(eff[key]) != mine[key]]
    if differ:
        return {**base, "passed": False,
                "verdict": "FAILS: the counters differ from the per-request rounds: " + "; ".join(differ)}
    e = conditional_acceptance(exact_pair(pair_name).target.name, law, records, rounds, EFFICIENCY.sampling, k, per_pos)
    return {**e, **base, "draft_tokens": mine["draft_tokens"], "accepted": mine["accepted"]}


def sampled_case_rounds(ad, cfg, case, info: dict) -> dict | None:
    """:func:`conformance.engines.rounds.case_rounds` for sampled drafts (a configuration's ``sampled_proposer``): on one
    case's completions (a serving condition's), the engine's per-request rounds placed in them (:func:`engine_rounds`),
    and the accepted drafts per position against the exact expectation given each round's text
    (:func:`conditional_acceptance`, the proposer's law sampled under the case's settings).
    ``passed`` None where the engine reports no per-request rounds."""
    import json
    from dataclasses import replace
    from pathlib import Path

    records = [json.loads(line) for line in (Path(info["dir"]) / info["file"]).read_text().splitlines()]
    if not records or not all("rounds" in r for r in records):
        return None
    rounds, problem = engine_rounds(records, prefill=ad.conventions.first_token_at_prefill)
    if problem:
        return {"passed": False, "text": f"the engine's per-request rounds {problem}"}
    k = ad.k_of(cfg)
    law = replace(proposal_law(cfg.sampled_proposer, ad.families[case.family]), sample=True)
    observed = [sum(1 for r in rounds if r.accepted >= j) for j in range(1, k + 1)]
    e = conditional_acceptance(case.model, law, records, rounds, case.sampling, k, observed)
    shown = ", ".join(f"{r['observed']:.3f} / {r['expected']:.3f}" for r in e["positions"])
    return {"passed": e["passed"], "positions": e["positions"],
            "text": f"acceptance per draft position (observed / exact given each round's text): {shown}, "
                    f"{e['drafts']} rounds: {e['verdict']}"}
