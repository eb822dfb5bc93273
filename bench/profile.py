"""``specdec-bench profile``: does speculation pay? A speedup profile for any decoder (issue 18).

For a backend claiming ``decoder`` (B = 1) or ``batched_decoder`` (B > 1), the reference by default
(``--backend module:factory|NAME``, :func:`conformance.backends.load_backend`):

1. paired, interleaved timing of the reference AR (same target, lean forward) and the backend's speculative
   decoding for every k on the same prompts (:mod:`specdec_bench.profile_timing`): seconds per token after the first
   round, the per-unit paired ratio, its median and a bootstrap 95 % interval (:mod:`specdec_bench.profile_stats`);
2. the backend's reported phases, where it reports them (contract: "Phase timings"), checked against the
   measured wall time within :data:`PHASE_TOLERANCE`;
3. the cost model fitted and checked, per k (:mod:`specdec_bench.profile_model`), the breakeven acceptance, the best k
   and the verdict line;
4. a context-length sweep (:mod:`specdec_bench.profile_context`) and memory (:mod:`specdec_bench.profile_memory`);
5. JSON, Markdown and plots (:mod:`specdec_bench.profile_report`, :mod:`specdec_bench.profile_plots`).

Pairs: ``trained`` (the shipped byte-level pair, 256 positions) and ``wide-exact``
(:mod:`specdec_ref.exact.wide`: an exact order-1 table in a wide 8-layer target against a one-layer draft).

Proposers (``--proposer``): the pair's draft model (default), prompt lookup (``ngram``: ``Ngram(1, 3)``, either pair)
or the exactly-known EAGLE head (``eagle``: :func:`specdec_ref.exact.heads.exact_eagle_head` on the wide-exact target,
one decoder layer of the target's width; argmax drafts, vLLM's default). The backend must claim ``proposer:NAME``.
The cost model's terms for them: :mod:`specdec_bench.profile_model`.
"""
from __future__ import annotations

import argparse
import time
from statistics import median
from typing import Callable, Sequence

import torch

from specdec_ref.contract import Capabilities
from specdec_ref.models import model_dims
from specdec_ref.warp import GREEDY, SamplingConfig

from .kit import Subcommand, environment, int_list, load_average
from .profile_context import context_sweep
from .profile_memory import memory_snapshot
from .profile_model import drafter_module, fit_model, least_interfered, measure_costs, verdict
from .profile_stats import bootstrap_median, paired_ratio
from .profile_timing import acceptance_by_position, by_unit, log_stderr, run_paired

__all__ = ["PAIRS", "PHASE_TOLERANCE", "PROPOSERS", "ProfileRows", "load_pair", "profile", "proposer_draft", "SUBCOMMAND"]

#: |sum of the reported phases / measured wall - 1| allowed per call (the rest: argument validation, result set-up).
PHASE_TOLERANCE = 0.05
PAIRS = ("trained", "wide-exact")
PROPOSERS = ("draft", "ngram", "eagle")


def proposer_draft(name: str, pair: str, target, draft):
    """What the profile passes as ``draft`` for ``--proposer name``: the pair's draft model, ``Ngram(1, 3)`` or the
    exact EAGLE head on the wide-exact target (ValueError elsewhere)."""
    if name == "draft":
        return draft
    if name == "ngram":
        from specdec_ref.proposers import Ngram

        return Ngram(1, 3)
    if name == "eagle":
        if pair != "wide-exact":
            raise ValueError("the exactly-known EAGLE head reads the wide-exact target's features: use --pair wide-exact")
        from specdec_ref.exact.heads import exact_eagle_head

        return exact_eagle_head(target, "order1-target", sample=False)
    raise ValueError(f"unknown proposer {name!r}; known: {', '.join(PROPOSERS)}")


def load_pair(name: str, **wide) -> tuple:
    """``(target, draft, make_prompts(n, length, seed), description, positions)`` of a named pair; ``positions``
    caps prompt + new tokens (the trained pair's training context, below its models' 512 positions)."""
    if name == "trained":
        from specdec_ref.pretrained import CONTEXT_LENGTH, load_trained_pair, sample_prompts

        target, draft = load_trained_pair()
        return target, draft, lambda n, length, seed: sample_prompts(n, length=length, seed=seed), (
            f"trained pair (target Llama 2x128, draft Qwen2 1x64, V=256, trained at {CONTEXT_LENGTH} tokens; byte prompts from "
            "held-out text)"), CONTEXT_LENGTH
    if name == "wide-exact":
        from specdec_ref.exact.wide import NARROW_DRAFT, WIDE_TARGET, WideSpec, wide_exact_pair

        spec = WideSpec(**{**WIDE_TARGET.__dict__, **{k: v for k, v in wide.items() if v is not None}})
        target, draft = wide_exact_pair(spec, NARROW_DRAFT)

        def prompts(n: int, length: int, seed: int):
            gen = torch.Generator().manual_seed(seed)
            return [torch.randint(0, 8, (1, length), generator=gen) for _ in range(n)]

        return target, draft, prompts, (
            f"wide-exact pair (order1-target in a Llama {spec.layers}x{spec.hidden}, intermediate {spec.intermediate}; "
            f"order1-draft-close in a Llama {NARROW_DRAFT.layers}x{NARROW_DRAFT.hidden}; exact laws, V=8, random prompts)"), None
    raise ValueError(f"unknown pair {name!r}; known: {', '.join(PAIRS)}")


def _phase_check(runs) -> dict:
    """Reported phases against the tool's clock, per call: prefill + every round against the wall, and the rounds
    after the first against the measured decode time (both within :data:`PHASE_TOLERANCE`)."""
    reported = [r for r in runs if r.reported]
    if not reported:
        return {"reported": False, "tolerance": PHASE_TOLERANCE, "calls": 0, "within": None}
    gaps = [sum(r.reported.values()) / r.wall - 1 for r in reported]
    decode = [sum(_decode_phases(r).values()) / r.decode_seconds - 1 for r in reported if r.decode_seconds > 0]
    worst, worst_decode = max(gaps, key=abs), max(decode, key=abs)
    return {"reported": True, "tolerance": PHASE_TOLERANCE, "calls": len(gaps), "unreported_calls": len(runs) - len(reported),
            "median_gap": median(gaps), "worst_gap": worst, "median_decode_gap": median(decode), "worst_decode_gap": worst_decode,
            "within": abs(worst) <= PHASE_TOLERANCE and abs(worst_decode) <= PHASE_TOLERANCE and len(reported) == len(runs)}


def _decode_phases(run) -> dict:
    """The reported phases of the timed part of a call: the rounds after the first, or (whole calls) all but prefill."""
    if run.whole:
        return {p: v for p, v in run.reported.items() if p != "prefill"}
    return run.reported_decode


def _per_k(runs, k: int, units: int) -> dict:
    acc = acceptance_by_position(runs)
    rounds = [r.decode_seconds / r.decode_rounds for r in runs if r.decode_rounds > 0]
    out = {**acc, "round": median(rounds), "per_token": median(r.per_token for r in runs),
           "tokens_per_batch_round": median(r.tokens_per_batch_round for r in runs if r.decode_rounds > 0),
           "first": None if runs[0].whole else median(r.first for r in runs), "phases": None}
    if all(r.reported_decode for r in runs):
        out["phases"] = {p: median(_decode_phases(r).get(p, 0.0) / r.decode_rounds for r in runs) for p in ("draft", "verify", "repair", "other")}
        out["prefill_reported"] = median(r.reported.get("prefill", 0.0) for r in runs)
    return out


def profile(
    backend=None, *, pair: str = "trained", target=None, draft=None, make_prompts: Callable | None = None,
    ks: Sequence[int] = (1, 2, 3, 4), batch: int = 1, prompts: int = 6, prompt_length: int = 32, new_tokens: int = 48,
    repeats: int = 5, mode: str = "greedy", contexts: Sequence[int] = (), context_k: int | None = None, context_repeats: int = 3,
    cost_seconds: float = 0.1, threads: int = 1, seed: int = 0, log: Callable[[str], None] | None = log_stderr,
    description: str | None = None, wide: dict | None = None, baseline: Callable | None = None, measure: Callable = measure_costs,
    proposer: str = "draft",
) -> dict:
    """Profile ``backend`` (default: the reference) on a pair (module docstring); a JSON-able report dict.

    ``prompts`` units of ``batch`` prompts each; ``target``/``draft``/``make_prompts(n, length, seed)`` replace the
    named pair; ``baseline(target, requests, on_step)`` replaces the reference AR and ``measure`` (as
    :func:`specdec_bench.profile_model.measure_costs`) the forward-cost measurement (tests inject known costs through both).
    Raises ValueError when the backend lacks the capability the batch size needs."""
    from conformance.backends import load_backend

    backend = backend if backend is not None and not isinstance(backend, str) else load_backend(backend)
    caps: Capabilities = backend.capabilities
    if batch > 1 and not caps.batched_decoder:
        raise ValueError(f"backend {backend.name!r} does not claim batched_decoder: profile it at --batch 1")
    if not (caps.decoder or caps.batched_decoder):
        raise ValueError(f"backend {backend.name!r} claims neither decoder nor batched_decoder: nothing to profile")
    if proposer != "draft" and not caps.has(f"proposer:{proposer}"):
        raise ValueError(f"backend {backend.name!r} does not claim proposer:{proposer}")
    ks = sorted(set(ks))
    if min(ks) < 1 or new_tokens < 2 * (max(ks) + 1) or repeats < 1 or prompts < 1 or batch < 1:
        raise ValueError("need k >= 1, new_tokens >= 2 (max k + 1), repeats, prompts and batch >= 1")
    positions = None
    if target is not None and proposer != "draft":
        raise ValueError(f"proposer={proposer!r} replaces a named pair's draft model; with your own target pass the "
                         f"proposer spec as draft= instead")
    if target is None:
        target, draft, make_prompts, description, positions = load_pair(pair, **(wide or {}))
        draft = proposer_draft(proposer, pair, target, draft)
        if proposer != "draft":
            description += f"; proposer: {proposer} ({type(draft).__name__}) in place of the draft model"
    sampling = GREEDY if mode == "greedy" else SamplingConfig(temperature=1.0)
    drafter = drafter_module(draft)
    max_pos = min(model_dims(target)["max_positions"] or 1 << 30, (model_dims(drafter)["max_positions"] if drafter is not None else 0) or 1 << 30,
                  positions or 1 << 30)
    if prompt_length + new_tokens + max(ks) + 1 > max_pos:
        raise ValueError(f"prompt length {prompt_length} + new tokens {new_tokens} + k exceeds the pair's {max_pos} positions")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    load_before, started = load_average(), time.perf_counter()
    try:
        def make_units(length: int) -> list[list[torch.Tensor]]:
            flat = make_prompts(prompts * batch, length, seed)
            return [flat[u * batch : (u + 1) * batch] for u in range(prompts)]

        units = make_units(prompt_length)
        cost_args = dict(context=prompt_length + new_tokens // 2, seconds=cost_seconds)
        costs_before = measure(target, draft, units[0], ks, **cost_args)
        if log:
            log(f"profile {backend.name}: {description}; k={ks}, B={batch}, {prompts} units, {repeats} repeats")
        extra = {} if baseline is None else {"baseline": baseline}
        runs = run_paired(backend, target, draft, ks, units, new_tokens=new_tokens, sampling=sampling, repeats=repeats, seed=seed, log=log,
                          **extra)
        memory_main = memory_snapshot()
        costs_after = measure(target, draft, units[0], ks, **cost_args)
        costs = least_interfered(costs_before, costs_after)
        ar_grid = by_unit(runs["ar"], prompts, lambda r: r.per_token)
        ratios = {k: paired_ratio(ar_grid, by_unit(runs[f"spec k={k}"], prompts, lambda r: r.per_token), seed=seed) for k in ks}
        per_k = {k: _per_k(runs[f"spec k={k}"], k, prompts) for k in ks}
        ar_per_token = median(r.per_token for r in runs["ar"])
        model = fit_model(costs, ar_per_token, per_k, ratios)
        spec_runs = [r for k in ks for r in runs[f"spec k={k}"]]
        mismatches = None
        if mode == "greedy":
            ar_tokens = {(r.unit, r.repeat): r.tokens for r in runs["ar"]}
            mismatches = sum(r.tokens != ar_tokens[(r.unit, r.repeat)] for r in spec_runs)
        whole = runs["ar"][0].whole
        ar_first = None if whole else bootstrap_median(by_unit(runs["ar"], prompts, lambda r: r.first), seed=seed).as_dict()
        context = None
        if contexts:
            best_k = context_k or max(model["rows"], key=lambda r: r["measured"])["k"]
            if log:
                log(f"context sweep at k={best_k}: {list(contexts)}")
            context = context_sweep(backend, target, draft, contexts=contexts, k=best_k, make_units=make_units, new_tokens=new_tokens,
                                    sampling=sampling, repeats=context_repeats, max_positions=max_pos, cost_seconds=cost_seconds,
                                    seed=seed, log=log, baseline=baseline, measure=measure)
    finally:
        torch.set_num_threads(previous)
    report = {
        "title": f"{backend.name} on the {pair if description is None or pair in description else 'given'} pair, B={batch}, {mode}"
                 + ("" if proposer == "draft" else f", proposer {proposer}"),
        "backend": backend.name, "declares_phase_timings": bool(getattr(caps, "phase_timings", False)),
        "pair": description, "proposer": proposer,
        "settings": dict(ks=ks, batch=batch, prompts=prompts, prompt_length=prompt_length, new_tokens=new_tokens,
                                               repeats=repeats, mode=mode, threads=threads, seed=seed, cost_seconds=cost_seconds),
        "verdict": verdict(model, costs), "costs": costs.as_dict(), "model": model,
        "costs_measured": {"before": costs_before.as_dict(), "after": costs_after.as_dict()},
        "ar": {"per_token": ar_per_token, "first": ar_first},
        "timing": ("whole calls, prefill included (the backend calls no on_round)" if whole
                   else "seconds per token after the first round or step (prefill and the first round timed apart)"),
        "first_round": {str(k): per_k[k]["first"] for k in ks},
        "prefill_reported": {str(k): per_k[k].get("prefill_reported") for k in ks},
        "phase_check": _phase_check(spec_runs), "greedy_mismatches": mismatches,
        "memory": memory_main, "context": context,
        "environment": environment(), "load_average": {"before": load_before, "after": load_average()},
        "seconds": time.perf_counter() - started,
    }
    return report


class ProfileRows(list):
    """The per-k rows :mod:`specdec_bench.cli` prints and stores, carrying the whole report (``.report``)."""

    report: dict


def add_profile_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default=None, help="module:factory or a registered NAME (default: the reference)")
    p.add_argument("--pair", choices=PAIRS, default="trained", help="model pair (default trained)")
    p.add_argument("--proposer", choices=PROPOSERS, default="draft",
                   help="draft with the pair's draft model (default), prompt lookup (ngram) or the exact EAGLE head (eagle, wide-exact)")
    p.add_argument("--k", type=int_list, default=[1, 2, 3, 4], help="draft lengths (default 1,2,3,4)")
    p.add_argument("--batch", type=int, default=1, help="rows decoded together, B (B > 1 needs batched_decoder; default 1)")
    p.add_argument("--prompts", type=int, default=6, help="units (B prompts each) (default 6)")
    p.add_argument("--prompt-length", type=int, default=32, help="prompt tokens (default 32)")
    p.add_argument("--new-tokens", type=int, default=48, help="new tokens per row, no EOS (default 48)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved timed repeats after one warm-up (default 5)")
    p.add_argument("--mode", choices=("greedy", "sampling"), default="greedy", help="greedy or temperature-1 sampling (default greedy)")
    p.add_argument("--contexts", type=lambda t: [] if t.strip().lower() in ("", "none") else int_list(t), default=[32, 64, 128],
                   help="prompt lengths of the context sweep, capped by the pair's positions (default 32,64,128; none: no sweep)")
    p.add_argument("--context-k", type=int, default=None, help="k of the sweep (default: the best measured k)")
    p.add_argument("--context-repeats", type=int, default=3, help="repeats per context length (default 3)")
    p.add_argument("--cost-seconds", type=float, default=0.1, help="seconds per timed repeat of each forward cost (default 0.1)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--seed", type=int, default=0, help="prompt and sampling seed (default 0)")
    p.add_argument("--out", default=None, help="folder for profile.json, profile.md and the plots (default: print only)")
    p.add_argument("--stem", default="profile", help="file name stem in --out (default profile)")
    p.add_argument("--no-plots", action="store_true", help="skip the plots (no matplotlib needed)")
    p.add_argument("--wide-layers", type=int, default=None, help="wide-exact target layers (default 8)")
    p.add_argument("--wide-hidden", type=int, default=None, help="wide-exact target hidden size (m a^2, a a power of 2; default 512)")
    p.add_argument("--wide-intermediate", type=int, default=None, help="wide-exact target MLP size (default 2048)")


def run_profile(args: argparse.Namespace) -> list[dict]:
    from .profile_report import write_report

    report = profile(
        args.backend, pair=args.pair, ks=args.k, batch=args.batch, prompts=args.prompts, prompt_length=args.prompt_length,
        new_tokens=args.new_tokens, repeats=args.repeats, mode=args.mode, contexts=args.contexts, context_k=args.context_k,
        context_repeats=args.context_repeats, cost_seconds=args.cost_seconds, threads=args.threads, seed=args.seed,
        wide=dict(layers=args.wide_layers, hidden=args.wide_hidden, intermediate=args.wide_intermediate), proposer=args.proposer,
    )
    if args.out:
        report["files"] = write_report(report, args.out, stem=args.stem, plots=not args.no_plots)
    rows = ProfileRows(report["model"]["rows"])
    rows.report = report
    return rows


def _print_profile(args, rows: ProfileRows, out) -> None:
    from .profile_report import text_report

    print(text_report(rows.report), file=out)


SUBCOMMAND = Subcommand(
    "profile",
    "does speculation pay? paired AR vs speculative timing with intervals, the cost model fitted and checked, phases, "
    "breakeven, context sweep, JSON/Markdown/plots, for any backend claiming decoder",
    add_profile_arguments,
    run_profile,
    (),
    lambda args, rows: [rows.report["verdict"]],
    lambda args: [],
    print_rows=_print_profile,
    exit_status=lambda rows: int(bool(rows.report.get("greedy_mismatches"))),
    json_extra=lambda rows: {"report": rows.report},
)
