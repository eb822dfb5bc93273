"""Planned looks: a completions file, or a growing one, certified on prefixes with the main job's sequential rule.

The lines of a file are taken in their order (the order the engine generated them in) and tested at planned looks,
each on a longer prefix (:class:`Looks`, its :meth:`~Looks.schedule`):

* the **interim look** on :data:`INTERIM_FRACTION` of the nominal N, every test at alpha x ``INTERIM_ALPHA_SCALE``:
  a rejection there is final;
* the **early-pass looks** on each of ``EARLY_PASS_FRACTIONS`` of the nominal N: a look rejects as the interim look
  does (a p-value below alpha x ``INTERIM_ALPHA_SCALE``, a token of probability 0, a broken invariant) and passes
  when every test's statistic is at or below its futility bound (:func:`specdec_properties.early_pass.early_pass`, against
  what the full look detects); a test that fails at alpha but not at the interim alpha sends the file to the full
  look;
* the **full look** on ``reserve_scale()`` x the nominal N at alpha, every test stating its power net of the
  ``EARLY_PASS_BETA`` the early-pass looks spent.

Rules: the family-wise alpha of one file is alpha x (1 + (1 + early looks) x ``INTERIM_ALPHA_SCALE``); every test of a
decision states the power of the whole procedure (union bounds, whatever the dependence between the prefixes); L,
the tested length of each prompt, is chosen once from the prompt's share of the full look, so every look tests the
same law. A file that ends before the next look's prefix with no look decided is *undecided* (``INCONCLUSIVE``,
stating the look that needs more lines); lines past the full look are not read. Greedy completions are checked one
by one, so they get one look, the full one (a divergence on any prefix rejects).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from specdec_properties.early_pass import EARLY_PASS_BETA, early_pass, reserve_scale, spend_early_pass_power

from ..profiles import EARLY_PASS_FRACTIONS, INTERIM_ALPHA_SCALE, get_profile

__all__ = ["INTERIM_FRACTION", "Look", "Looks", "LookRecord", "Sequential", "run_looks"]

#: Share of the nominal N the interim look reads (the main job's ``ci`` profile's).
INTERIM_FRACTION = get_profile("ci").interim_fraction


@dataclass(frozen=True)
class Look:
    """One planned look: ``kind`` (``interim``, ``early_pass`` or ``full``), the lines it reads, its share of N."""

    kind: str
    n: int
    fraction: float


@dataclass(frozen=True)
class Looks:
    """The planned looks of a file whose fixed-size test would read ``nominal_n`` lines (the N its power is sized
    for). The full look reads ``reserve_scale()`` times that."""

    nominal_n: float
    interim_fraction: float = INTERIM_FRACTION
    early_pass_fractions: tuple[float, ...] = EARLY_PASS_FRACTIONS
    whole_file: bool = False  # made by :meth:`whole` (a replay then says ``--looks``, not ``--planned-n``)

    def __post_init__(self):
        if not self.nominal_n > 0:
            raise ValueError(f"the nominal N of the looks must be positive, got {self.nominal_n!r}")
        fractions = [self.interim_fraction, *self.early_pass_fractions]
        if any(not 0 < f < 1 for f in fractions) or sorted(set(fractions)) != fractions:
            raise ValueError(f"look fractions must increase strictly inside (0, 1), got {fractions}")

    @classmethod
    def whole(cls, n_lines: int) -> "Looks":
        """The looks of a file given whole: its last line ends the full look."""
        return cls(n_lines / reserve_scale(), whole_file=True)

    @property
    def full_n(self) -> int:
        return max(1, round(self.nominal_n * reserve_scale()))

    @property
    def beta_per_look(self) -> float:
        return EARLY_PASS_BETA / len(self.early_pass_fractions) if self.early_pass_fractions else 0.0

    def schedule(self, greedy: bool = False) -> list[Look]:
        """The looks in order, their prefixes strictly growing (a look that would read no more lines than the one
        before it, or as many as the full look, is left out). Greedy: the full look alone."""
        planned = [] if greedy else [("interim", self.interim_fraction)] + [
            ("early_pass", f) for f in self.early_pass_fractions]
        out: list[Look] = []
        for kind, fraction in planned:
            n = max(1, math.ceil(fraction * self.nominal_n - 1e-9))
            if n < self.full_n and (not out or n > out[-1].n):
                out.append(Look(kind, n, fraction))
        return out + [Look("full", self.full_n, reserve_scale())]

    def family_alpha(self, alpha: float, greedy: bool = False) -> float:
        """What a correct engine's file risks over all looks: the full look's alpha and every rejection look's."""
        rejecting = sum(1 for x in self.schedule(greedy) if x.kind != "full")
        return alpha * (1 + rejecting * INTERIM_ALPHA_SCALE)

    def as_record(self) -> dict:
        return {"nominal_n": self.nominal_n, "full_n": self.full_n, "interim_fraction": self.interim_fraction,
                "early_pass_fractions": list(self.early_pass_fractions), "interim_alpha_scale": INTERIM_ALPHA_SCALE,
                "early_pass_beta": EARLY_PASS_BETA}


@dataclass(frozen=True)
class LookRecord:
    """What one look saw: ``outcome`` ``reject``, ``pass``, ``continue`` (the next look), ``to_full`` (failed at alpha
    but not at the interim alpha, or no futility bound: the full look decides) or ``final`` (the full look)."""

    kind: str
    n: int
    fraction: float
    outcome: str
    why: str = ""

    def as_record(self) -> dict:
        return {"kind": self.kind, "n": self.n, "fraction": self.fraction, "outcome": self.outcome, "why": self.why}


@dataclass
class Sequential:
    """The looks of one file: those taken, whether one decided, the lines the decision read, and (undecided) the
    lines the next look needs. ``statistics``: the deciding look's tests, each stating the whole procedure's power."""

    looks: Looks
    taken: list[LookRecord] = field(default_factory=list)
    decided: bool = False
    n_used: int = 0
    next_n: int | None = None
    statistics: list[dict] = field(default_factory=list)
    greedy: bool = False
    alpha: float | None = None  # the alpha the deciding look's verdict was judged at (the full one's or a rejection's)

    @property
    def deciding(self) -> LookRecord | None:
        return self.taken[-1] if self.decided and self.taken else None

    def summary(self) -> str:
        """One line: where the file was decided and on how many lines, or what the next look needs."""
        plan = f"planned looks at N = {', '.join(str(x.n) for x in self.looks.schedule(self.greedy))}"
        if not self.decided:
            return (f"undecided after {self.n_used} line(s): no look decided; the next look needs {self.next_n} lines "
                    f"({plan})")
        d = self.deciding
        where = {"interim": "the interim look", "early_pass": "an early-pass look", "full": "the full look"}[d.kind]
        verb = {"reject": "rejected at", "pass": "passed at", "final": "decided at"}[d.outcome]
        share = "" if d.kind == "full" else f", {d.fraction:g} of the nominal N"
        return f"{verb} {where} on {d.n} line(s){share} ({plan})"

    def as_record(self) -> dict:
        d = self.deciding
        return {"decided": self.decided, "n_used": self.n_used, "next_n": self.next_n,
                "look": d.kind if d else None, "outcome": d.outcome if d else None,
                "taken": [x.as_record() for x in self.taken], "plan": self.looks.as_record(),
                "summary": self.summary()}


#: ``judge(lines, alpha, length_scale)``: the verdict of a prefix of the file at ``alpha``, L chosen for
#: ``length_scale`` times each prompt's lines (the nominal N's share) (a :class:`conformance.samples.verdict.SamplesVerdict`).
Judge = Callable[[Sequence, float, float], object]


def _rejects(verdict, interim_alpha_scale: float) -> bool:
    """A look rejects as the interim look would: a broken invariant, a token of probability 0, a greedy divergence,
    or a test whose p-value is below its alpha x ``interim_alpha_scale``."""
    if verdict.violations or verdict.impossible or verdict.divergences:
        return True
    return any(f.p_value < f.alpha * interim_alpha_scale for f in verdict.fits)


def run_looks(lines: Sequence, looks: Looks, judge: Judge, *, alpha: float, greedy: bool = False,
              resume: Sequential | None = None):
    """``(verdict, Sequential)``: the looks of ``looks`` on prefixes of ``lines``, up to the first that decides.

    The verdict is the deciding look's (or, undecided, the last look's that ran in this call, None when none could);
    the caller words its level from :class:`Sequential` (:func:`conformance.samples.verdict.certify_samples` does).
    ``resume``: the looks an earlier call took on a shorter prefix of the same lines (undecided): they are not run
    again, the next ones are."""
    if resume is not None and (resume.decided or resume.looks != looks or resume.greedy != greedy):
        raise ValueError("resume needs an undecided run of the same looks")
    seq = Sequential(looks, greedy=greedy, taken=list(resume.taken) if resume is not None else [])
    schedule = looks.schedule(greedy)
    verdict = None
    done_n = seq.taken[-1].n if seq.taken else 0
    skip_to_full = any(x.outcome == "to_full" for x in seq.taken)
    for look in schedule:
        if look.n <= done_n or (skip_to_full and look.kind != "full"):
            continue
        if look.n > len(lines):
            seq.next_n = look.n
            seq.n_used = len(lines)
            if verdict is None and lines and greedy:  # greedy: a divergence on the lines so far is conclusive
                early = judge(lines, alpha, looks.nominal_n / len(lines))
                if _rejects(early, 1.0):
                    seq.taken.append(LookRecord("full", len(lines), look.fraction, "reject",
                                                "a greedy divergence or a broken invariant on the lines so far"))
                    return _decided(seq, early, len(lines), [], alpha)
            return verdict, seq
        prefix = lines[: look.n]
        scale = looks.full_n / look.n  # the full look's lines per line of this look
        at_nominal = looks.nominal_n / look.n  # L is chosen for the nominal N: power 0.99 there, 0.99 + beta at the full look
        if look.kind == "interim":
            verdict = judge(prefix, alpha * INTERIM_ALPHA_SCALE, at_nominal)
            if verdict.level == "not_certified":
                seq.taken.append(LookRecord(look.kind, look.n, look.fraction, "reject",
                                            f"alpha x {INTERIM_ALPHA_SCALE:g}; the rest of the sample was not read"))
                return _decided(seq, verdict, look.n, [f.as_record() for f in verdict.fits], alpha * INTERIM_ALPHA_SCALE)
            seq.taken.append(LookRecord(look.kind, look.n, look.fraction, "continue"))
            continue
        if look.kind == "early_pass":
            verdict = judge(prefix, alpha, at_nominal)
            if _rejects(verdict, INTERIM_ALPHA_SCALE):
                verdict = judge(prefix, alpha * INTERIM_ALPHA_SCALE, at_nominal)  # stated at the alpha it rejected at
                seq.taken.append(LookRecord(look.kind, look.n, look.fraction, "reject",
                                            f"alpha x {INTERIM_ALPHA_SCALE:g}; the rest of the sample was not read"))
                return _decided(seq, verdict, look.n, [f.as_record() for f in verdict.fits], alpha * INTERIM_ALPHA_SCALE)
            if verdict.level == "not_certified":
                skip_to_full = True
                seq.taken.append(LookRecord(look.kind, look.n, look.fraction, "to_full",
                                            "a test fails at alpha, not at the interim alpha: the full look decides"))
                continue
            if verdict.level == "inconclusive" and verdict.transitions is None:
                skip_to_full = True
                seq.taken.append(LookRecord(look.kind, look.n, look.fraction, "to_full", "no test to look at"))
                continue
            fits = verdict.fits
            decision, why = early_pass([f.as_record() for f in fits], beta=looks.beta_per_look, scale=scale, fits=fits)
            if decision == "pass":
                stats = [spend_early_pass_power(f.as_record(), f, f.n * scale, look_n=f.n, look_beta=looks.beta_per_look,
                                                project_groups=True)
                         | {"early_pass": {"look_n": f.n, "fraction": look.fraction}} for f in fits]
                seq.taken.append(LookRecord(look.kind, look.n, look.fraction, "pass",
                                            f"every statistic at or below the bound a deviation at the stated "
                                            f"alternative exceeds with probability >= {1 - looks.beta_per_look:g}"))
                return _decided(seq, verdict, look.n, stats, alpha)
            outcome = "to_full" if decision == "ineligible" else "continue"
            skip_to_full = decision == "ineligible"
            seq.taken.append(LookRecord(look.kind, look.n, look.fraction, outcome, why))
            continue
        verdict = judge(prefix, alpha, at_nominal)  # the full look
        spent = any(x.kind == "early_pass" for x in schedule)
        stats = [spend_early_pass_power(f.as_record()) if spent else f.as_record() for f in verdict.fits]
        seq.taken.append(LookRecord("full", look.n, look.fraction, "final"))
        return _decided(seq, verdict, look.n, stats, alpha)
    return verdict, seq


def _decided(seq: Sequential, verdict, n: int, statistics: list[dict], alpha: float):
    seq.decided, seq.n_used, seq.next_n, seq.statistics, seq.alpha = True, n, None, statistics, alpha
    return verdict, seq
