"""The checks of request features beside a case's law: the log-probabilities an engine returns, and the n > 1
completions of one request.

Engine-neutral, called by the runner on each case's file after its law's verdict. A wrong log-probability makes the
case NOT CERTIFIED whatever its law (:mod:`conformance.engines.logprobs` states the rule); the n > 1 note is descriptive
and names copies as the explanation of a failed law.
"""
from __future__ import annotations

import json
from pathlib import Path

from .verdict import CaseVerdict, Check, Level

__all__ = ["apply_logprobs_check", "copies_note"]


def copies_note(case, path: Path) -> Check:
    """For a case with n > 1 completions per request: in how many requests all n are the same completion, against the
    share the exact law gives independent completions (``sum_x P(x)^n``). Descriptive (``passed`` None): the verdict
    is the law's; where the law failed and copies are several times too frequent, the runner names them as the
    departure's explanation."""
    from properties.sequences import continuation_law
    from specdec_ref.exact_models import exact_model

    groups: dict = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        groups.setdefault((r.get("seed"), tuple(r["prompt_ids"])), []).append(tuple(r["completion_ids"]))
    full = [g for g in groups.values() if len(g) == case.samples]
    same = sum(1 for g in full if len(set(g)) == 1)
    em = exact_model(case.model)
    law = continuation_law(em, list(case.prompt), case.max_new_tokens, case.sampling,
                           eos_id=int(em.eos_id) if case.eos else None)
    share = sum(float(p) ** case.samples for p in law.values())
    expected = share * len(full)
    text = (f"all {case.samples} completions the same in {same} of {len(full)} requests (independent completions: "
            f"{expected:.1f} expected, share {share:.4f})")
    explain = same > 3 * expected + 10  # several times the independent share: the completions share their randomness
    if explain:
        text = f"a request's {case.samples} completions are copies of one another: " + text
    return Check(None, text, {"requests": len(full), "identical": same, "expected": expected, "copies_explain": explain})


def apply_logprobs_check(ad, cfg, case, info: dict, c: CaseVerdict) -> None:
    """The case's returned log-probabilities against the exact values (:mod:`.logprobs`), under the convention the
    adapter declares for the configuration; a wrong one makes the case NOT CERTIFIED, the law's own level kept as
    ``law_level``."""
    from .logprobs import logprob_check

    convention = ad.logprobs_of(cfg)
    if convention is None:
        c.logprobs = Check(None, f"{ad.title}'s adapter declares no log-probability convention: not checked")
        return
    try:
        lines = map(json.loads, (Path(info["dir"]) / info["file"]).read_text().splitlines())
        c.logprobs = logprob_check(case, lines, convention)
    except Exception as exc:  # noqa: BLE001 - our tooling failed on this case: named, never the runner's crash
        c.law_level, c.level = c.level, Level.TOOL_ERROR
        c.headline = f"TOOL ERROR: logprobs check: {type(exc).__name__}: {exc}"[:300]
        return
    if c.logprobs is not None and c.logprobs.passed is False:
        c.law_level, c.level = c.level, Level.NOT_CERTIFIED
        c.headline = f"NOT CERTIFIED: {c.logprobs.detail['summary']}; the law alone: {c.headline}"[:300]
