"""Tokens of probability 0 in a file of completions: the first of each completion, where it stands, and the declared
rule that forbids it where one does (the grammar, the bad words: the rule the engine did not apply there).

An impossible token is the engine's failure (``NOT CERTIFIED``, every one counted); the tokens after it are not
tested (their context is outside the law's support). :func:`impossible_entries` gives the report's entries,
:func:`forbidden_counts` and :func:`forbidden_note` what the verdict says of the rules.
"""
from __future__ import annotations

from collections import Counter

from specdec_properties.transitions import first_impossible
from specdec_ref.automaton import forbidden_by
from specdec_ref.warp import SamplingConfig

from .read import SampleRecord

__all__ = ["impossible_entries", "forbidden_counts", "forbidden_note"]


def _request(r: SampleRecord):
    """A request: one seed of one prompt (its ``n`` samples share it); a line without a seed is its own request."""
    return ("seed", r.prompt, r.seed) if r.seed is not None else ("line", r.line)


def impossible_entries(exact, records: list[SampleRecord], sampling: SamplingConfig, eos_id, max_new_tokens: int,
                        stop=None):
    """``(first_impossible per record, the report's entries)`` (:func:`specdec_properties.transitions.first_impossible`)."""
    found = first_impossible(exact, ((r.prompt, r.completion) for r in records), sampling, eos_id=eos_id,
                             max_position=max_new_tokens, stop=stop)
    names = exact.token_names() if callable(getattr(exact, "token_names", None)) else None
    entries = [
        {"index": i, "line": records[i].line, "request": _request(records[i]), "prompt": list(records[i].prompt),
         "position": f.position, "context": list(f.context), "token": f.token,
         **({"name": names[f.token]} if names else {}), **_forbidden(sampling, records[i].prompt, f)}
        for i, f in enumerate(found) if f is not None
    ]
    return found, entries


def _forbidden(sampling: SamplingConfig, prompt, found) -> dict:
    """``{"forbidden_by": rule}`` when a declared rule (the grammar, the bad words) forbids the impossible token: the
    engine did not apply it there (:func:`specdec_ref.automaton.forbidden_by`)."""
    if sampling.constraint is None and not sampling.bad_words:
        return {}
    rule = forbidden_by(sampling.constraint, sampling.bad_words, found.context[len(prompt):], found.token)
    return {"forbidden_by": rule} if rule else {}


def forbidden_counts(impossible: list[dict]) -> dict[str, int]:
    """``{rule: how many impossible tokens it forbids}`` (:func:`_forbidden`)."""
    return dict(sorted(Counter(d["forbidden_by"] for d in impossible if d.get("forbidden_by")).items()))


def forbidden_note(impossible: list[dict]) -> str:
    """`` (K of them a token the grammar forbids)`` for the impossible tokens a declared rule forbids."""
    by_rule = forbidden_counts(impossible)
    if not by_rule:
        return ""
    return " (" + ", ".join(f"{k} of them a token the {rule} forbid{'s' if rule == 'grammar' else ''}"
                            for rule, k in sorted(by_rule.items())) + ")"
