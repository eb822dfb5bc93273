"""The verdict on a completions file: :func:`certify_samples` runs every test, :class:`SamplesVerdict` words it.

Invariant: the family-wise alpha is split evenly over the tests the verdict rests on (each prompt's full-law
test and the pooled transition test; the per-position statistics only localise); the verdict words are the
suite's own (:mod:`conformance.report`, plus ``INCONCLUSIVE``) and :func:`replay_command` reproduces it. A token
of probability 0 under the exact law of its context is the engine's failure (``NOT CERTIFIED``, every one counted, the
first of each completion shown; the tokens after it untested), never an input error. A known alternative convention
(:mod:`.conventions`) that fits a failing file adds one line (``explained``) and never changes the level.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec_properties.flips import FlipVerdict
from specdec_properties.stats import ALPHA, TARGET_POWER, FitResult, judge_power
from specdec_properties.transitions import FIRST_TESTED_POSITION, count_transitions, transition_test
from specdec_ref.warp import SamplingConfig

from ..report import CERTIFIED, NOT_CERTIFIED, REDUCED
from .command import replay_command
from .conventions import explain, judged_contexts
from .law import SAMPLES_TV, _settings_label
from .impossible import forbidden_counts, forbidden_note, impossible_entries
from .looks import Looks, Sequential, run_looks
from .prompts import PromptReport, _greedy_test, _sampling_test, check_poolable, prompt_groups
from .read import (
    SampleRecord,
    SamplesInputError,
    _is_int,
    _max_positions,
    _model_name,
    _resolve_model,
    _vocab,
    _where,
    invariant_violations,
    read_records,
)
from ..report import show_ids

#: Positions after the first up to this one get a transition test each (all of them are in the pooled test).
MAX_POSITION_TESTS = 16
#: Impossible tokens printed in the report (and kept as examples in the record).
SHOWN_IMPOSSIBLE = 5
RECORDED_IMPOSSIBLE = 20

INCONCLUSIVE = "INCONCLUSIVE"  # CERTIFIED, REDUCED and NOT_CERTIFIED are the suite's own words (conformance.report)


def _fit_lines(head: str, f: FitResult) -> list[str]:
    """``head``, then the test's statistic, alpha, power and pass/FAIL on the same line; on failure its cells."""
    status = "pass" if f.passed else "FAIL"
    lines = [
        f"{head}, chi-square {f.statistic:.1f} on {f.df} df, p={f.p_value:.3g}, alpha={f.alpha:.3g}, "
        f"power {f.power:.4f} against TV {f.tv:g}, detects TV >= {f.detects:.3g}: {status}"
    ]
    if not f.passed:
        lines.extend("    " + x for x in f.report().splitlines()[1:])
    return lines


@dataclass
class SamplesVerdict:
    """The outcome of :func:`certify_samples`: ``headline`` (the verdict words), ``level``, every test."""

    level: str  # "certified" | "reduced" | "not_certified" | "inconclusive"
    headline: str
    model: str
    sampling: SamplingConfig
    max_new_tokens: int
    eos_id: int | None
    source: str
    n: int
    prompts: list[PromptReport]
    violations: list[str]
    alpha: float
    tv: float
    replay: str
    power_note: str = ""
    transitions: FitResult | None = None  # every generated token after the first, pooled by context class
    position_fits: list[tuple[int, FitResult]] = field(default_factory=list)  # (position, its transition test)
    transition_classes: int = 0
    transition_excluded: dict = field(default_factory=dict)
    # the first token of probability 0 of each completion holding one: line, request, prompt, position, context, token
    impossible: list[dict] = field(default_factory=list)
    transitions_rest: FitResult | None = None  # the transition test without its impossible outcomes (when it has some)
    explained: str | None = None  # the one line a known alternative convention earns (:mod:`.conventions`)
    explained_by: dict | None = None
    sequential: Sequential | None = None  # planned looks (:mod:`.looks`): the looks taken and what decided
    family_alpha: float | None = None  # planned looks: the alpha of every look together
    stop: object = None  # the stop strings (specdec_properties.stops.StopStrings) completions end at, besides EOS

    @property
    def impossible_requests(self) -> int:
        """How many requests (one seed of one prompt; a line without a seed is its own request) hold an impossible token."""
        return len({d["request"] for d in self.impossible})

    @property
    def impossible_by_position(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for d in self.impossible:
            out[d["position"]] = out.get(d["position"], 0) + 1
        return dict(sorted(out.items()))

    @property
    def positions_tested(self) -> list[int]:
        """The generated positions (1-based) some test covered: 1..L of the full-law tests and every transition."""
        tested = set()
        for p in self.prompts:
            if p.fit is not None and p.length:
                tested.update(range(1, p.length + 1))
        tested.update(pos for pos, _ in self.position_fits)
        return sorted(tested)

    @property
    def certified(self) -> bool:
        return self.level in ("certified", "reduced")

    @property
    def exit_code(self) -> int:
        return 0 if self.certified else 1

    @property
    def fits(self) -> list[FitResult]:
        """The tests the verdict rests on: the prompts' full-law tests, then the pooled transition test.

        ``position_fits`` (the same transition statistic per generated position) localise a departure; they
        share the pooled test's alpha and are not counted as further tests.
        """
        out = [p.fit for p in self.prompts if p.fit is not None]
        return out + ([self.transitions] if self.transitions is not None else [])

    @property
    def divergences(self) -> list[dict]:
        return [d for p in self.prompts for d in p.divergences]

    @property
    def flips(self) -> list[dict]:
        return [f for p in self.prompts for f in p.flips]

    def report(self) -> str:
        lines = [self.headline]
        if self.explained:
            lines.append(f"explained: {self.explained}")
        mode = "greedy" if self.sampling.greedy else "sampling"
        lines.append(
            f"model {self.model}, {mode} ({_settings_label(self.sampling, self.eos_id, self.stop)}), max_new_tokens={self.max_new_tokens}; "
            f"{self.source}: N={self.n} completions of {sum(p.pooled for p in self.prompts)} prompt(s)"
            + (f" (pooled by the table cell they end in: {len(self.prompts)} test(s))"
               if any(p.pooled > 1 for p in self.prompts) else "")
        )
        if not self.sampling.greedy:
            n_tests = len(self.fits)
            lines.append(
                "statistics: Pearson chi-square against the exact law from the tables, per prompt (the first L tokens) and "
                "per context class (every token after the first given its context); "
                f"family-wise alpha={self.alpha:g} ({self.alpha / max(n_tests, 1):.3g} per test, {n_tests} tests); "
                f"alternative: every law at TV >= {self.tv:g}; power target {TARGET_POWER:g}"
            )
        else:
            lines.append(
                "greedy: every completion compared token for token with the target's greedy continuation "
                "(deterministic: no alpha, no power; divergences classified as in specdec_properties.flips)"
            )
        for p in self.prompts:
            if p.fit is not None:
                f = p.fit
                lines.extend(_fit_lines(
                    f"  prompt {show_ids(p.prompt)}{p.pooled_text}: N={f.n}, L={p.length} ({len(f.labels) - 1} cells; "
                    f"{p.length_reason})", f
                ))
            else:
                status = "pass" if p.passed else "FAIL"
                lines.append(
                    f"  prompt {show_ids(p.prompt)}{p.pooled_text}: N={p.n} greedy completions, {len(p.divergences)} algorithmic divergence(s), "
                    f"{len(p.flips)} numerical flip(s): {status}"
                )
                for d in p.divergences[:5]:
                    got = "<end of completion>" if d["got"] is None else d["got"]
                    lines.append(
                        f"    {_where(self.source, d['line'])}: prompt {show_ids(p.prompt)}, position {d['position']}: "
                        f"expected {d['expected']}, got {got}; completion {d['completion']}"
                    )
                    lines.append("      " + d["verdict"].describe())
                if len(p.divergences) > 5:
                    lines.append(f"    ... {len(p.divergences) - 5} more divergent completions")
                for fl in p.flips[:3]:
                    lines.append(f"    numerical flip ({_where(self.source, fl['line'])}): " + fl["verdict"].describe())
        if not self.sampling.greedy:
            lines.extend(self._transition_lines())
            lines.extend(self._impossible_lines())
        if self.violations:
            lines.append(f"deterministic invariants: {len(self.violations)} violation(s):")
            lines.extend("  " + v for v in self.violations[:20])
            if len(self.violations) > 20:
                lines.append(f"  ... {len(self.violations) - 20} more")
        else:
            lines.append("deterministic invariants: ok (max_new_tokens tokens unless ended by EOS, nothing after EOS)"
                         if self.stop is None else "deterministic invariants: ok (max_new_tokens tokens unless ended by "
                         "EOS or a stop string, nothing after either, finish_reason and text as the tokens say)")
        if self.power_note:
            lines.append(self.power_note)
        if self.sequential is not None:
            lines.append(f"planned looks: {self.sequential.summary()}; family-wise alpha {self.family_alpha:.3g}")
            stated = [r for r in self.sequential.statistics if r.get("power") is not None]
            if stated and self.level in ("certified", "reduced"):
                lines.append(
                    f"  the procedure (every look together): power >= {min(r['power'] for r in stated):.4f} against TV "
                    f"{self.tv:g}, detects TV >= {max(r['detects'] for r in stated):.3g} (its full look's, net of the "
                    f"power the early-pass looks spent)")
        lines.append(f"replay: {self.replay}")
        return "\n".join(lines)

    def _transition_lines(self) -> list[str]:
        tested = self.positions_tested
        span = f"{tested[0]}-{tested[-1]}" if len(tested) > 1 else (str(tested[0]) if tested else "none")
        lines = [f"positions tested: {span}" + ("" if self.transitions is not None else
                                                 " (no position after the first: speculation untested)")]
        f = self.transitions
        if f is None:
            return lines
        lines.extend(_fit_lines(f"  {f.what.split(':')[0]}: N={f.n} tokens in {self.transition_classes} context class(es)", f))
        if self.position_fits:
            lines.append("    per position (localisation, not further tests; 'departs' where p < the pooled test's alpha):")
        for pos, pf in self.position_fits:
            status = "departs" if not pf.passed else "ok"
            impossible = sum(k for _, k in pf.impossible)
            lines.append(
                f"    position {pos}: N={pf.n}, chi-square {pf.statistic:.1f} on {pf.df} df, p={pf.p_value:.3g}, "
                f"detects TV >= {pf.detects:.3g}" + (f", {impossible} impossible" if impossible else "") + f": {status}"
            )
            if not pf.passed and f.passed is False and pos == min(q for q, g in self.position_fits if not g.passed):
                lines.extend("      " + x for x in pf.table(max_rows=8).splitlines())
        for why, k in self.transition_excluded.items():
            lines.append(f"  {k} token(s) not tested: {why}")
        return lines

    @property
    def rest_fits(self) -> list[FitResult]:
        """The tests that met impossible outcomes, rerun without them (diagnostics, not further tests)."""
        out = [p.rest_fit for p in self.prompts if p.rest_fit is not None]
        return out + ([self.transitions_rest] if self.transitions_rest is not None else [])

    def _impossible_lines(self) -> list[str]:
        if not self.impossible:
            return []
        by_position = ", ".join(f"{pos}: {k}" for pos, k in self.impossible_by_position.items())
        lines = [
            f"impossible tokens: {len(self.impossible)} of {self.n} completion(s), in {self.impossible_requests} request(s), "
            f"hold a token the exact law gives probability 0 (by position: {by_position}){forbidden_note(self.impossible)}; "
            "each is an impossible outcome "
            "of its tests, the tokens after it are not tested"
        ]
        for d in self.impossible[:SHOWN_IMPOSSIBLE]:
            name = f" ({d['name']})" if d.get("name") else ""
            lines.append(
                f"  {_where(self.source, d['line'])}: prompt {show_ids(d['prompt'])}, position {d['position']}, context {show_ids(d['context'])}: "
                f"token {d['token']}{name}, probability 0"
                + (f" (the {d['forbidden_by']} forbid{'s' if d['forbidden_by'] == 'grammar' else ''} it)"
                   if d.get("forbidden_by") else "")
            )
        if len(self.impossible) > SHOWN_IMPOSSIBLE:
            lines.append(f"  ... {len(self.impossible) - SHOWN_IMPOSSIBLE} more")
        for f in self.rest_fits:
            status = "fits the law" if f.passed else "departs from the law too"
            lines.append(
                f"  the rest, tested as usual: {f.what.split(' (')[0]}: N={f.n}, chi-square {f.statistic:.1f} on {f.df} df, "
                f"p={f.p_value:.3g}, alpha={f.alpha:.3g}: {status}"
            )
        return lines

    def as_record(self) -> dict:
        return {
            "level": self.level,
            "positions_tested": self.positions_tested,
            "transition_positions": [pos for pos, _ in self.position_fits],
            "transition_classes": self.transition_classes,
            "transition_excluded": dict(self.transition_excluded),
            "localisation": [{"position": pos, **pf.as_record()} for pos, pf in self.position_fits],
            "headline": self.headline,
            "certified": self.certified,
            "model": self.model,
            "sampling": self.sampling.as_dict(),
            "max_new_tokens": self.max_new_tokens,
            "eos_id": self.eos_id,
            **({"stop": list(self.stop.strings), "token_prefix": self.stop.prefix} if self.stop is not None else {}),
            "n": self.n,
            "alpha": self.alpha,
            "tv": self.tv,
            "statistics": (list(self.sequential.statistics) if self.sequential is not None and self.sequential.decided
                           else [f.as_record() for f in self.fits]),
            "violations": list(self.violations),
            "divergences": [
                {k: (v.as_record() if isinstance(v, FlipVerdict) else v) for k, v in d.items()} for d in self.divergences
            ],
            "impossible": {
                "completions": len(self.impossible), "requests": self.impossible_requests,
                "by_position": {str(pos): k for pos, k in self.impossible_by_position.items()},
                "forbidden_by": forbidden_counts(self.impossible),
                "rest": [f.as_record() for f in self.rest_fits],
                "examples": [{k: v for k, v in d.items() if k not in ("request", "index")}
                             for d in self.impossible[:RECORDED_IMPOSSIBLE]],
            },
            "explained": self.explained,
            "explained_by": self.explained_by,
            "replay": self.replay,
            **({"sequential": self.sequential.as_record(), "family_alpha": self.family_alpha}
               if self.sequential is not None else {}),
        }


def certify_samples(
    path_or_records,
    *,
    model,
    sampling: SamplingConfig,
    max_new_tokens: int,
    eos_id: int | None = None,
    length: int | None = None,
    alpha: float = ALPHA,
    tv: float = SAMPLES_TV,
    dtype: torch.dtype | str = torch.float32,
    tolerance: float | None = None,
    looks: Looks | bool | None = None,
    resume: Sequential | None = None,
    stop=None,
    pool_prompts: bool = False,
) -> SamplesVerdict:
    """Judge completions of ``model`` (an exact model's name or object) produced with ``sampling``.

    ``looks``: test at planned looks on prefixes of the file, in its line order (:mod:`conformance.samples.looks`):
    a :class:`~conformance.samples.looks.Looks` (a growing file: its nominal N), or True (the file given whole is the
    full look); the verdict then rests on the deciding look's prefix (``verdict.n``) and states the looks taken
    (``verdict.sequential``); a file that ends before any look decided is ``INCONCLUSIVE`` (a partial sample). None
    (the default): the whole file, one look. ``resume``: the undecided ``verdict.sequential`` of an earlier call on the
    same file when it was shorter; only the looks its new lines complete run (:class:`.growing.GrowingFile` does this).

    ``path_or_records``: a JSONL path or an iterable of dicts (:mod:`conformance.samples` docstring). ``eos_id``: the EOS
    the engine stopped at (``True``: the model's own; ``None``: no EOS stop). ``length``: the L of the
    sequence law (default: :func:`choose_length` per prompt). ``dtype``: what the engine computed in
    (greedy: the flip tolerance is :func:`specdec_properties.flips.tolerance_for` of it at the row's logit scale);
    ``tolerance``: an absolute logit tolerance instead. Raises :class:`SamplesInputError` for malformed input; a
    token the law gives probability 0 is no input error but the engine's failure (``verdict.impossible``). Conventions
    are read from ``sampling`` (``top_k_ties``); when the file is ``NOT CERTIFIED`` and fits another known one
    (:data:`conformance.samples.conventions.CONVENTIONS`), ``verdict.explained`` says so in one line. ``stop``: stop
    strings (a :class:`specdec_properties.stops.StopStrings`, or a sequence of strings on an exact model's vocabulary with no
    token prefix): a completion also ends at the token that completes one (a leaf of the law like EOS), and a
    record's ``text`` must be its tokens' rendering cut before the stop string.

    ``pool_prompts``: one full-law test per table cell the prompts end in (``ExactModel.cell``), not per prompt: the
    law reads a context only through its cell, and the next cell is a function of the cell and the token, so prompts
    ending in one cell have one continuation law (:func:`.prompts.check_poolable` refuses settings that read more).
    """
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a specdec_ref.warp.SamplingConfig, got {type(sampling).__name__}")
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    exact = _resolve_model(model)
    if eos_id is True:
        eos_id = int(exact.eos_id)
    vocab = _vocab(exact)
    if eos_id is not None and not (_is_int(eos_id) and 0 <= eos_id < vocab):
        raise ValueError(f"eos_id must be None, True or a token id in [0, {vocab}), got {eos_id!r}")
    if length is not None and not (_is_int(length) and 1 <= length <= max_new_tokens):
        raise ValueError(f"length must be an int in [1, max_new_tokens={max_new_tokens}], got {length!r}")
    dtype = getattr(torch, dtype.removeprefix("torch.")) if isinstance(dtype, str) else dtype
    if stop is not None and not hasattr(stop, "end"):
        from specdec_properties.stops import StopStrings

        try:
            stop = StopStrings.for_model(exact, tuple(stop))
        except ValueError as exc:
            raise SamplesInputError(str(exc)) from None
    if pool_prompts:
        check_poolable(exact, sampling, stop)
    records, source = read_records(
        path_or_records, vocab=vocab, max_new_tokens=max_new_tokens,
        min_context=int(getattr(exact, "min_context", 1) or 1), max_positions=_max_positions(exact), model=exact,
    )
    name = model if isinstance(model, str) else _model_name(exact)
    if looks is True:
        looks = Looks.whole(len(records))
    looks = looks or None

    def judge_lines(lines, settings: SamplingConfig, a: float, length_scale: float = 1.0) -> SamplesVerdict:
        return _judge(exact, name, list(lines), source, settings, max_new_tokens=max_new_tokens, eos_id=eos_id,
                      length=length, alpha=a, tv=tv, dtype=dtype, tolerance=tolerance, length_scale=length_scale,
                      looks=looks, stop=stop, pool_prompts=pool_prompts)

    judged, at_alpha, at_scale = records, alpha, 1.0
    if looks is None:
        verdict = judge_lines(records, sampling, alpha)
    else:
        verdict, seq = run_looks(records, looks, lambda lines, a, sc: judge_lines(lines, sampling, a, sc), alpha=alpha,
                                 greedy=sampling.greedy, resume=resume)
        if verdict is None:  # fewer lines than the first look reads: judged as they are, undecided
            verdict = judge_lines(records, sampling, alpha, looks.nominal_n / max(len(records), 1))
        judged, at_alpha, at_scale = records[: verdict.n], seq.alpha or alpha, looks.nominal_n / max(verdict.n, 1)
        _word_looks(verdict, seq, looks, tv, alpha)
    if verdict.level == "not_certified" and not verdict.violations:
        # a known alternative convention (conventions.CONVENTIONS) that fits earns one line; the level never changes
        stops = {d["index"]: d["position"] for d in verdict.impossible}
        contexts = judged_contexts(
            ((r.prompt, r.completion, stops.get(i, min(_judged_length(r.completion, eos_id, stop), max_new_tokens)))
             for i, r in enumerate(judged))
        )
        verdict.explained, verdict.explained_by = explain(
            exact, sampling, contexts, lambda settings: judge_lines(judged, settings, at_alpha, at_scale), eos_id=eos_id)
    return verdict


def _word_looks(verdict: SamplesVerdict, seq: Sequential, looks: Looks, tv: float, alpha: float) -> None:
    """The verdict's level and headline from its planned looks: undecided is INCONCLUSIVE (a partial sample), a
    rejection keeps the deciding look's words, a pass states the whole procedure's power."""
    verdict.sequential = seq
    verdict.family_alpha = looks.family_alpha(alpha, verdict.sampling.greedy)
    d = seq.deciding
    if d is None:
        verdict.level = "inconclusive"
        verdict.headline = f"{INCONCLUSIVE}: a partial sample, no look decided (the next look needs {seq.next_n} lines)"
        return
    where = {"interim": "the interim look", "early_pass": "an early-pass look", "full": "the full look"}[d.kind]
    if d.outcome == "reject" or verdict.level == "not_certified":
        verdict.level = "not_certified"
        verdict.headline += f" (rejected at {where}, N={d.n})"
        return
    if verdict.level == "inconclusive" or verdict.sampling.greedy:
        return
    verdict.level, verdict.headline, verdict.power_note = power_level(seq.statistics, tv)
    if d.kind == "early_pass":
        verdict.headline += f" (passed at {where}, N={d.n} of the {looks.full_n} planned)"


def power_level(records: list[dict], tv: float) -> tuple[str, str, str]:
    """``(level, headline, note)`` of tests that all passed, from the power they state (records of
    :meth:`specdec_properties.stats.FitResult.as_record`, or a planned look's, stating the whole procedure's power)."""
    power, why = judge_power(records)
    if power == "inconclusive":
        return "inconclusive", f"{INCONCLUSIVE}: too few samples", why
    if power == "reduced":
        x = max(r["detects"] for r in records)
        return "reduced", f"{REDUCED}: detects TV >= {x:.3g}", f"too few samples for power {TARGET_POWER:g} against TV {tv:g}; {why}"
    return "certified", CERTIFIED, f"every prompt's test has power >= {TARGET_POWER:g} against TV {tv:g}"


def _judged_length(completion: tuple[int, ...], eos_id: int | None, stop=None) -> int:
    """The tokens of a completion the law covers: up to and including its first EOS or completed stop string."""
    end = completion.index(eos_id) + 1 if eos_id is not None and eos_id in completion else len(completion)
    stopped = stop.end(completion[:end]) if stop is not None else None
    return end if stopped is None else stopped


def _judge(exact, name: str, records: list[SampleRecord], source: str, sampling: SamplingConfig, *, max_new_tokens: int,
           eos_id: int | None, length: int | None, alpha: float, tv: float, dtype, tolerance,
           length_scale: float = 1.0, looks: Looks | None = None, stop=None,
           pool_prompts: bool = False) -> SamplesVerdict:
    """Every test of :func:`certify_samples` on read records, under ``sampling`` (``length_scale``: L is chosen for
    that many times each prompt's lines, the full look's share at a planned look; ``pool_prompts``: one full-law test
    per table cell the prompts end in, its law the first such prompt's)."""
    replay = replay_command(
        name, sampling, max_new_tokens=max_new_tokens, eos=eos_id is not None, length=length, source=source,
        dtype=str(dtype).removeprefix("torch."), tv=tv, tolerance=tolerance, looks=looks, stop=stop,
        pool_prompts=pool_prompts,
    )
    groups, distinct = prompt_groups(exact, records, pool_prompts)
    violations = invariant_violations(records, max_new_tokens=max_new_tokens, eos_id=eos_id, source=source, stop=stop)
    counts = None
    impossible: list[dict] = []
    position_tests: list[int] = []
    if not sampling.greedy:
        # an impossible token is the engine's failure: counted, shown, an impossible outcome of its tests; the tokens after
        # it are not tested (their context is outside the law's support, maybe not even one the model defines)
        found, impossible = impossible_entries(exact, records, sampling, eos_id, max_new_tokens, stop)
        # positions past max_new_tokens are an invariant violation (reported), not tested
        counts = count_transitions(exact, [(r.prompt, r.completion) for r in records], sampling, eos_id=eos_id,
                                   max_position=max_new_tokens, impossible=found, stop=stop)
        if len(counts.positions) > 1:  # with one position the pooled test is that position's test
            position_tests = [pos for pos in counts.positions if pos <= MAX_POSITION_TESTS]
    # alpha split evenly over the tests the verdict rests on: the prompts' full-law tests and the pooled transition
    # test (the per-position transition statistics localise a departure; they are not further tests)
    n_tests = len(groups) + (1 if counts is not None and counts.n else 0)
    per_alpha = alpha / n_tests
    reports = []
    for prompt, group in groups.items():
        if sampling.greedy:
            reports.append(_greedy_test(
                exact, prompt, group, sampling, max_new_tokens=max_new_tokens, eos_id=eos_id, dtype=dtype,
                tolerance=tolerance, stop=stop))
        else:
            reports.append(_sampling_test(
                exact, prompt, group, sampling, max_new_tokens=max_new_tokens, eos_id=eos_id, length=length,
                alpha=per_alpha, tv=tv, length_n=max(1, round(len(group) * length_scale)), stop=stop,
            ))
    for report in reports:
        report.pooled = len(distinct[report.prompt])
    transitions, position_fits = None, []
    if counts is not None and counts.n:
        settings = _settings_label(sampling, eos_id, stop)
        last = counts.positions[-1]
        transitions = transition_test(
            counts, what=f"positions {FIRST_TESTED_POSITION}-{last}: every generated token after the first given its context ({settings})",
            alpha=per_alpha, tv=tv,
        )
        position_fits = [
            (pos, transition_test(counts, what=f"position {pos}: the generated token given its context ({settings})",
                                  positions=[pos], alpha=per_alpha, tv=tv))
            for pos in position_tests
        ]
    transitions_rest = None
    if transitions is not None and transitions.impossible:
        transitions_rest = transition_test(
            counts, what=f"positions {FIRST_TESTED_POSITION}-{counts.positions[-1]} without their impossible tokens ({settings})",
            alpha=per_alpha, tv=tv, possible_only=True,
        )
    failed = [p for p in reports if not p.passed]
    failed_transitions = transitions is not None and not transitions.passed
    # what fails beyond the impossible tokens (which fail their tests by themselves)
    beyond = [p for p in reports if p.fails_beyond_impossible]
    beyond_transitions = failed_transitions and (transitions_rest is None or not transitions_rest.passed)
    note = ""
    if violations or failed or failed_transitions or impossible:
        parts = []
        if impossible:
            requests = len({d["request"] for d in impossible})
            parts.append(f"{len(impossible)} completion(s) in {requests} request(s) hold a token of probability 0"
                         + forbidden_note(impossible)
                         + (" (the other tokens fit the law)" if not beyond and not beyond_transitions else ""))
        if beyond:
            what = "sequence law" if not sampling.greedy else "greedy continuation"
            parts.append(f"{len(beyond)} of {len(reports)} prompt(s) fail the {what}")
        if beyond_transitions:
            where = sorted(pos for pos, f in position_fits if not f.passed)
            parts.append("the law of the tokens after the first fails" + (
                f" (departs first at position {where[0]})" if where else ""))
        if violations:
            parts.append(f"{len(violations)} invariant violation(s)")
        level, headline = "not_certified", f"{NOT_CERTIFIED}: " + ", ".join(parts)
    elif sampling.greedy:
        level, headline = "certified", CERTIFIED
        if any(p.flips for p in reports):
            within = f"tolerance {tolerance:g}" if tolerance is not None else f"the {dtype} tolerance"
            note = f"{sum(len(p.flips) for p in reports)} numerical flip(s) within {within} (reported, not failures)"
    elif transitions is None:
        level = "inconclusive"
        headline = f"{INCONCLUSIVE}: no generated position after the first was tested (speculation untested)"
        note = ("the first generated token is sampled from the prefill, before any draft exists; a file tests drafted "
                "positions only when its completions have 2 or more tokens"
                + (f"; {sum(counts.excluded.values())} transition(s) excluded: " + "; ".join(counts.excluded)
                   if counts is not None and counts.excluded else ""))
    else:
        level, headline, note = power_level([p.fit.as_record() for p in reports] + [transitions.as_record()], tv)
    return SamplesVerdict(
        level=level, headline=headline, model=name, sampling=sampling, max_new_tokens=max_new_tokens, eos_id=eos_id,
        source=source, n=len(records), prompts=reports, violations=violations, alpha=alpha, tv=tv, replay=replay,
        power_note=note, transitions=transitions, position_fits=position_fits,
        transition_classes=len(counts.classes) if counts is not None else 0,
        transition_excluded=dict(counts.excluded) if counts is not None else {}, impossible=impossible,
        transitions_rest=transitions_rest, stop=stop,
    )
