"""Known alternatives to the declared settings: conventions engines legitimately differ on, and settings ignored.

A convention is a choice the sampling settings alone leave open and engines make differently, stated as a
:class:`specdec_ref.warp.SamplingConfig` field that the reference warper, the exact laws and this tool all read
(today: the top-k tie rule, ``top_k_ties``). The file is judged under the declared value. An *ignored setting* is a
declared setting the engine accepted and did not apply (:data:`IGNORABLE`: ``logit_bias``, ``min_new_tokens``, the
penalties, ``min_p``; engines have shipped each silently dropped under speculation): its alternative is the law
without it. Invariant: an alternative never changes a verdict's level; when a file is ``NOT CERTIFIED`` under the
declared settings, the laws of the tested contexts differ under a known alternative, and the file fits that one
(every test passes at the same alpha), the verdict gains one line saying so (:func:`explain`): conventions are tried
first, then each ignored setting alone, then all the declared ones together.

To add a convention: a field of ``SamplingConfig`` that :func:`specdec_ref.warp.warp_logits` honours, its command
line flag in :mod:`conformance.samples.cli`, and one :class:`Convention` per value in :data:`CONVENTIONS`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable

import torch

from specdec_properties.sequences import next_token_law
from specdec_ref.warp import TOP_K_TIES, SamplingConfig

from .law import _EXTRA_SETTINGS, extra_settings_on, setting_text

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


@dataclass(frozen=True)
class IgnoredSetting:
    """A setting an engine may accept and not apply: ``off`` is its value when it has no effect."""

    name: str  # the SamplingConfig field: "logit_bias"
    flag: str  # its command-line flag: "--logit-bias"
    off: object


#: The settings whose silent omission the tool names: every history-dependent and min-p setting the command takes.
IGNORABLE: tuple[IgnoredSetting, ...] = tuple(IgnoredSetting(name, flag, off) for flag, name, _, off in _EXTRA_SETTINGS)


def ignored_alternatives(sampling: SamplingConfig) -> list[tuple[tuple[IgnoredSetting, ...], SamplingConfig]]:
    """``(settings dropped, the settings without them)``: each declared ignorable setting alone, then all of them
    together when more than one is declared."""
    by_name = {s.name: s for s in IGNORABLE}
    held = [by_name[name] for _, name, _ in extra_settings_on(sampling)]
    out = [((s,), replace(sampling, **{s.name: s.off})) for s in held]
    if len(held) > 1:
        out.append((tuple(held), replace(sampling, **{s.name: s.off for s in held})))
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
    REDUCED POWER`` (every test passed, no impossible token, no invariant broken). Conventions come first (an
    undeclared convention is no defect), then ignored settings (:func:`ignored_alternatives`).
    """
    tried = [(c, other) for c, other in alternatives(sampling)] + ignored_alternatives(sampling)
    for what, other in tried:
        if not law_differs(model, contexts, sampling, other, eos_id=eos_id):
            continue
        verdict = rejudge(other)
        if verdict.level not in ("certified", "reduced"):
            continue
        fits = verdict.fits
        if fits:
            p = min(f.p_value for f in fits)
            fit = (f"p = {p:.3g} (the smallest of its {len(fits)} tests' p-values, alpha {fits[0].alpha:.3g} each; "
                   f"{verdict.headline} there)")
        else:  # greedy: deterministic, every completion checked
            p, fit = None, f"every completion equals that law's greedy continuation ({verdict.headline} there)"
        record = {"p_value": p, "level": verdict.level, "headline": verdict.headline, "sampling": other.as_dict(),
                  "replay": verdict.replay}
        if isinstance(what, Convention):
            line = f"departs only {what.where}; fits {what.flag}, {fit}"
            record.update(convention=what.name, flag=what.flag, where=what.where)
        else:
            names = [s.name for s in what]
            names = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
            declared = ", ".join(f"{s.flag} {setting_text(getattr(sampling, s.name), s.name)}" for s in what)
            verb = "has" if len(what) == 1 else "have"
            line = f"{names} {verb} no effect: the file fits the law without {'it' if len(what) == 1 else 'them'} " \
                   f"(declared {declared}), {fit}"
            record.update(ignored=[s.name for s in what], flag=declared)
        return line, record
    return None, None

