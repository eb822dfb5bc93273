"""Conventions engines legitimately differ on: declared in the settings, and the alternatives the tool knows.

A convention is a choice the sampling settings alone leave open and engines make differently, stated as a
:class:`specdec_ref.warp.SamplingConfig` field that the reference warper, the exact laws and this tool all read
(today: the top-k tie rule, ``top_k_ties``). The file is judged under the declared value. Invariant: an
alternative never changes a verdict's level; when a file is ``NOT CERTIFIED`` under the declared settings, the
laws of the tested contexts differ under another known convention, and the file fits that one (every test
passes at the same alpha), the verdict gains one line saying so (:func:`explain`).

To add a convention: a field of ``SamplingConfig`` that :func:`specdec_ref.warp.warp_logits` honours, its command
line flag in :mod:`conformance.samples.cli`, and one :class:`Convention` per value in :data:`CONVENTIONS`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable

import torch

from properties.sequences import next_token_law
from specdec_ref.warp import TOP_K_TIES, SamplingConfig

#: ``SamplingConfig.top_k_ties`` value -> its spelling on the command line (``--top-k-ties``).
TOP_K_TIES_CLI = {"all": "all", "lowest_ids": "lowest-ids"}
assert tuple(TOP_K_TIES_CLI) == TOP_K_TIES


@dataclass(frozen=True)
class Convention:
    """One value of a convention: ``convert`` puts it into any settings (a no-op where they already hold it)."""

    name: str  # "top_k_ties=lowest_ids"
    flag: str  # the command line that declares it: "--top-k-ties lowest-ids"
    where: str  # where it can change the law, for the explanation: "where top-k cuts a tie"
    convert: Callable[[SamplingConfig], SamplingConfig]


def _top_k_ties(rule: str) -> Callable[[SamplingConfig], SamplingConfig]:
    return lambda sampling: replace(sampling, top_k_ties=rule)


#: Every alternative the tool knows, in the order it tries them.
CONVENTIONS: tuple[Convention, ...] = tuple(
    Convention(f"top_k_ties={rule}", f"--top-k-ties {cli}", "where top-k cuts a tie", _top_k_ties(rule))
    for rule, cli in TOP_K_TIES_CLI.items()
)


def alternatives(sampling: SamplingConfig) -> list[tuple[Convention, SamplingConfig]]:
    """``(convention, settings under it)`` for every known convention the declared ``sampling`` does not hold."""
    if sampling.greedy:
        return []
    out = []
    for convention in CONVENTIONS:
        other = convention.convert(sampling)
        if other != sampling:
            out.append((convention, other))
    return out


def judged_contexts(completions: Iterable[tuple[tuple[int, ...], tuple[int, ...], int]]) -> dict:
    """``{prompt: {prefix, ...}}``: every context a test judged a token in.

    ``completions``: ``(prompt, completion, last)`` with ``last`` the last position judged (the first EOS, or the
    completion's first impossible token: nothing after it is judged).
    """
    contexts: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
    for prompt, completion, last in completions:
        prefixes = contexts.setdefault(tuple(prompt), set())
        for pos in range(1, last + 1):
            prefixes.add(tuple(completion[: pos - 1]))
    return contexts


def law_differs(model, contexts: dict, a: SamplingConfig, b: SamplingConfig, *, eos_id) -> bool:
    """Whether the exact next-token law under ``a`` and under ``b`` differ at one of ``contexts`` (:func:`judged_contexts`)."""
    for prompt, prefixes in contexts.items():
        keys = sorted(prefixes)
        if keys and not torch.equal(next_token_law(model, list(prompt), keys, a, eos_id=eos_id),
                                    next_token_law(model, list(prompt), keys, b, eos_id=eos_id)):
            return True
    return False


def explain(model, sampling: SamplingConfig, contexts: dict, rejudge, *, eos_id) -> tuple[str | None, dict | None]:
    """``(line, record)`` when a file that failed under ``sampling`` fits a known alternative, else ``(None, None)``.

    ``rejudge(settings)`` judges the same file under other settings (same alpha, same alternative TV) and
    returns its :class:`conformance.samples.SamplesVerdict`. An alternative is tried only where its law differs
    from the declared one at a tested context; it fits when its verdict is ``CERTIFIED`` or ``CERTIFIED AT
    REDUCED POWER`` (every test passed, no impossible token, no invariant broken).
    """
    for convention, other in alternatives(sampling):
        if not law_differs(model, contexts, sampling, other, eos_id=eos_id):
            continue
        verdict = rejudge(other)
        if verdict.level not in ("certified", "reduced"):
            continue
        fits = verdict.fits
        p = min(f.p_value for f in fits)
        line = (
            f"departs only {convention.where}; fits {convention.flag}, p = {p:.3g} "
            f"(the smallest of its {len(fits)} tests' p-values, alpha {fits[0].alpha:.3g} each; {verdict.headline} there)"
        )
        record = {
            "convention": convention.name, "flag": convention.flag, "where": convention.where, "p_value": p,
            "level": verdict.level, "headline": verdict.headline, "sampling": other.as_dict(), "replay": verdict.replay,
        }
        return line, record
    return None, None
