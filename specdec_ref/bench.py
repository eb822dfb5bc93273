"""``specdec-bench``: benchmarks of the reference implementation (a command, not a timed test).

Subcommands (``specdec-bench SUBCOMMAND --help`` for options):

* ``verifier``: throughput of :data:`specdec_ref.verify.verify_block` in
  blocks/s over a (B, k, V, mode, threads) grid, median and p10/p90 over repeats.
* ``checks``: every registered conformance check case run on a backend without
  pytest, with CPU and wall seconds per case and per shared-sample group, the
  status, and the stated power / N / alpha of the statistical ones.
* ``decoder``: tokens/s of AR decoding, our speculative decoder (k grid) and
  transformers' assisted generation (pinned to the same k) on the shipped
  trained pair, greedy and sampling, variants interleaved over the repeats;
  acceptance, calls per token, phase shares, token-for-token equality with AR
  (greedy) and with transformers at the same seed, and the ">= 2x transformers'
  assisted generation" goal verdict.

Adding a subcommand: write ``add_X_arguments(parser)``, a ``run_X(args) -> list[dict]``
returning one dict per table row, its column list and (optionally) a
``summarise_X(args, rows) -> list[str]`` of verdict lines, then add a
:class:`Subcommand` to :data:`SUBCOMMANDS`. :func:`main` gives every subcommand
the shared ``--json PATH`` output, the environment header and the table printer.

Timings on a shared machine are noisy: every point is a median over repeats,
and the load average (``os.getloadavg()``) is printed before and after.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

#: Tensors of one grid point (inputs plus the verifier's B x V work buffers) above this are skipped.
MAX_POINT_BYTES = 2 * 1024**3
#: The project's throughput goal for the verifier (k=4, V=16, sampling, no validation, large B).
GOAL_BLOCKS_PER_S = 2e6
GOAL_K, GOAL_VOCAB = 4, 16
#: The project's goals for the statistical checks and the ci run.
GOAL_TV, GOAL_POWER, GOAL_ALPHA, GOAL_CPU_S = 0.003, 0.99, 1e-6, 10.0
GOAL_CI_WALL_S = 120.0

DEFAULT_BACKEND = "specdec_ref.backend:reference_backend"
#: Cases listed per shortfall in the checks summary (the table has them all).
MAX_LISTED = 8


# ----------------------------------------------------------------------------- shared plumbing


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: Callable[[Any], str] = str


def _fmt_float(digits: int) -> Callable[[Any], str]:
    return lambda v: "-" if v is None else f"{v:.{digits}f}"


def _fmt_rate(v: Any) -> str:
    """Blocks/s with an SI suffix (1.23M, 456.7k)."""
    if v is None:
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.3g}"


def _fmt_g(v: Any) -> str:
    return "-" if v is None else f"{v:.3g}"


def _fmt_int(v: Any) -> str:
    return "-" if v is None else f"{int(v):d}"


def format_table(rows: Sequence[dict], columns: Sequence[Column]) -> str:
    """A plain fixed-width table: text left-aligned, everything else right-aligned."""
    cells = [[c.header for c in columns]]
    for row in rows:
        cells.append(["" if row.get(c.key) is None and c.key not in row else c.fmt(row.get(c.key)) for c in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    numeric = [all(isinstance(row.get(c.key), (int, float)) or row.get(c.key) is None for row in rows) for c in columns]
    lines = []
    for n, r in enumerate(cells):
        parts = [v.rjust(w) if numeric[i] and n else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def load_average() -> tuple[float, float, float] | None:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())  # type: ignore[return-value]
    except (AttributeError, OSError):
        return None


def environment() -> dict:
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads_default": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) without needing numpy."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}") from exc


def choice_list(*choices: str) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [x for x in text.replace(" ", "").split(",") if x]
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(choices)}, got {text!r}")
        return items

    return parse


# ----------------------------------------------------------------------------- verifier


VERIFIER_COLUMNS = [
    Column("device", "device"),
    Column("dtype", "dtype"),
    Column("threads", "thr", _fmt_int),
    Column("mode", "mode"),
    Column("validate", "val", lambda v: "yes" if v else "no"),
    Column("batch", "B", _fmt_int),
    Column("k", "k", _fmt_int),
    Column("vocab", "V", _fmt_int),
    Column("calls", "calls/rep", _fmt_int),
    Column("blocks_per_s_median", "blocks/s med", _fmt_rate),
    Column("blocks_per_s_p10", "p10", _fmt_rate),
    Column("blocks_per_s_p90", "p90", _fmt_rate),
    Column("us_per_call_median", "us/call med", _fmt_float(1)),
    Column("us_per_call_p10", "p10", _fmt_float(1)),
    Column("us_per_call_p90", "p90", _fmt_float(1)),
    Column("mean_accepted", "mean m", _fmt_float(2)),
    Column("note", "note"),
]


def add_verifier_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int_list, default=[1, 64, 4096, 65536], help="batch sizes B (default 1,64,4096,65536)")
    p.add_argument("--k", type=int_list, default=[1, 4, 8], help="draft lengths k (default 1,4,8)")
    p.add_argument("--vocab", type=int_list, default=[16, 256, 32000], help="vocabulary sizes V (default 16,256,32000)")
    p.add_argument("--threads", type=int_list, default=[1], help="torch intra-op threads, a list is a grid axis (default 1; e.g. 1,2)")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per point (default 7)")
    p.add_argument("--min-seconds", type=float, default=0.2, help="minimum duration of one timed repeat (default 0.2)")
    p.add_argument("--warmup-seconds", type=float, default=0.05, help="warm-up duration per point (default 0.05)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="dtype of the probability tensors")
    p.add_argument("--mode", type=choice_list("sampling", "greedy"), default=["sampling", "greedy"], help="sampling,greedy (default both)")
    p.add_argument(
        "--validate",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="time verify_block(validate=True), which checks the inputs and synchronises with the host (default: --no-validate)",
    )
    p.add_argument("--max-gb", type=float, default=MAX_POINT_BYTES / 1024**3, help="skip points whose tensors exceed this (default 2)")
    p.add_argument("--seed", type=int, default=0)


def point_bytes(batch: int, k: int, vocab: int, mode: str, dtype: torch.dtype) -> int:
    """Input tensors plus the verifier's float32 work buffers (about four B x V rows and the float32 copies)."""
    size = torch.tensor([], dtype=dtype).element_size()
    inputs = batch * (k + 1) * vocab * size + (batch * k * vocab * size if mode == "sampling" else 0)
    upcast = 0 if dtype == torch.float32 else batch * (2 * k + 1) * vocab * 4
    work = 4 * batch * vocab * 4
    return inputs + upcast + work


def make_verifier_inputs(batch: int, k: int, vocab: int, mode: str, dtype: torch.dtype, device: str, seed: int):
    """Softmax rows distinct per (row, position); drafts sampled from the draft rows.

    Built in float32 on the device, then cast; greedy gets draft_probs=None but
    its drafts are still sampled from (unreturned) draft rows.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    # target = draft logits + noise, so the acceptance rate is neither ~0 nor ~1
    draft_logits = 2.0 * torch.randn(batch, k, vocab, generator=gen, device=device)
    target_logits = torch.cat([draft_logits, 2.0 * torch.randn(batch, 1, vocab, generator=gen, device=device)], dim=1)
    target_logits += 1.5 * torch.randn(batch, k + 1, vocab, generator=gen, device=device)
    draft_probs = torch.softmax(draft_logits, dim=-1)
    target_probs = torch.softmax(target_logits, dim=-1)
    del draft_logits, target_logits
    drafts = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=gen).reshape(batch, k)
    target_probs = target_probs.to(dtype)
    draft_probs = draft_probs.to(dtype) if mode == "sampling" else None
    return drafts, draft_probs, target_probs


class _Timer:
    """Wall seconds of ``calls`` calls; CUDA events + synchronize on CUDA."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def __call__(self, fn: Callable[[], Any], calls: int) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return time.perf_counter() - t0


def time_calls(fn: Callable[[], Any], device: str, *, repeats: int, min_seconds: float, warmup_seconds: float) -> tuple[int, list[float]]:
    """Warm up, pick calls per repeat so a repeat lasts >= min_seconds, return (calls, seconds per repeat)."""
    timer = _Timer(device)
    fn()  # first call: allocator, lazy init, kernel selection
    calls, elapsed = 1, timer(fn, 1)
    while elapsed < max(warmup_seconds, 1e-3):  # warm-up doubles as calibration
        calls *= 2
        elapsed = timer(fn, calls)
    per_call = elapsed / calls
    calls = max(1, math.ceil(min_seconds / per_call)) if per_call > 0 else calls
    return calls, [timer(fn, calls) for _ in range(repeats)]


def run_verifier(args: argparse.Namespace) -> list[dict]:
    from .verify import verify_block

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("specdec-bench verifier: --device cuda but torch.cuda.is_available() is False")
    dtype = getattr(torch, args.dtype)
    limit = int(args.max_gb * 1024**3)
    rows: list[dict] = []
    original_threads = torch.get_num_threads()
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            for vocab in args.vocab:
                for k in args.k:
                    for batch in args.batch:
                        for mode in args.mode:
                            row = dict(device=device, dtype=args.dtype, threads=threads, mode=mode, validate=args.validate, batch=batch, k=k, vocab=vocab)
                            need = point_bytes(batch, k, vocab, mode, dtype)
                            if need > limit:
                                rows.append(dict(row, note=f"skipped: ~{need / 1024**3:.1f} GB > {args.max_gb:g} GB"))
                                _progress(rows[-1])
                                continue
                            drafts, q, p = make_verifier_inputs(batch, k, vocab, mode, dtype, device, args.seed)
                            gen = torch.Generator(device=device).manual_seed(args.seed + 1)
                            validate = args.validate

                            def call():
                                return verify_block(drafts, q, p, generator=gen, validate=validate)

                            m, _ = call()
                            mean_m = float(m.double().mean())
                            calls, seconds = time_calls(call, device, repeats=args.repeats, min_seconds=args.min_seconds, warmup_seconds=args.warmup_seconds)
                            rates = [batch * calls / s for s in seconds]
                            us = [s / calls * 1e6 for s in seconds]
                            row.update(
                                calls=calls,
                                repeats=len(seconds),
                                blocks_per_s_median=percentile(rates, 50),
                                blocks_per_s_p10=percentile(rates, 10),
                                blocks_per_s_p90=percentile(rates, 90),
                                us_per_call_median=percentile(us, 50),
                                us_per_call_p10=percentile(us, 10),
                                us_per_call_p90=percentile(us, 90),
                                mean_accepted=mean_m,
                                load_average=load_average(),
                                note="",
                            )
                            rows.append(row)
                            _progress(row)
                            del drafts, q, p
    finally:
        torch.set_num_threads(original_threads)
    return rows


def _progress(row: dict) -> None:
    if row.get("blocks_per_s_median") is None:
        msg = row.get("note", "")
    else:
        msg = f"{_fmt_rate(row['blocks_per_s_median'])} blocks/s, {row['us_per_call_median']:.1f} us/call"
    print(
        f"  [thr={row['threads']} {row['mode']} B={row['batch']} k={row['k']} V={row['vocab']}] {msg}",
        file=sys.stderr,
        flush=True,
    )


def summarise_verifier(args: argparse.Namespace, rows: list[dict]) -> list[str]:
    goal = [
        r
        for r in rows
        if r["k"] == GOAL_K and r["vocab"] == GOAL_VOCAB and r["mode"] == "sampling" and not r["validate"]
        and r.get("blocks_per_s_median") is not None
    ]
    head = f"goal: >= {_fmt_rate(GOAL_BLOCKS_PER_S)} blocks/s at k={GOAL_K}, V={GOAL_VOCAB}, sampling, no validation, large B"
    if not goal:
        return [f"{head}: NOT MEASURED (the grid has no such point; add --k {GOAL_K} --vocab {GOAL_VOCAB} --mode sampling --no-validate)"]
    lines = [head + ":"]
    for threads in sorted({r["threads"] for r in goal}):
        points = [r for r in goal if r["threads"] == threads]
        largest = max(points, key=lambda r: r["batch"])
        fastest = max(points, key=lambda r: r["blocks_per_s_median"])
        rate = largest["blocks_per_s_median"]
        verdict = "REACHED" if rate >= GOAL_BLOCKS_PER_S else "NOT REACHED"
        line = (
            f"  threads={threads} B={largest['batch']} {largest['device']} {largest['dtype']}: median {_fmt_rate(rate)} blocks/s "
            f"(p10 {_fmt_rate(largest['blocks_per_s_p10'])}, p90 {_fmt_rate(largest['blocks_per_s_p90'])}) = "
            f"{rate / GOAL_BLOCKS_PER_S:.2f}x the goal -> {verdict}"
        )
        if fastest is not largest:
            line += f"; fastest B={fastest['batch']}: {_fmt_rate(fastest['blocks_per_s_median'])} blocks/s"
        lines.append(line)
    return lines


def verifier_header(args: argparse.Namespace) -> list[str]:
    return [
        f"verify_block, device {args.device}, dtype {args.dtype}, threads {args.threads}, validate={args.validate}, "
        f"{args.repeats} repeats of >= {args.min_seconds:g} s per point (median, p10, p90 over repeats)"
    ]


# ----------------------------------------------------------------------------- checks


CHECK_COLUMNS = [
    Column("id", "case"),
    Column("status", "status"),
    Column("cpu_s", "cpu s", _fmt_float(2)),
    Column("wall_s", "wall s", _fmt_float(2)),
    Column("tests", "tests", _fmt_int),
    Column("n_min", "N min", _fmt_int),
    Column("alpha_max", "alpha max", _fmt_g),
    Column("tv_max", "tv", _fmt_g),
    Column("power_min", "power min", _fmt_float(4)),
    Column("p_value_min", "p min", _fmt_g),
    Column("group_share_cpu_s", "share s", _fmt_float(2)),
]

GROUP_COLUMNS = [
    Column("group", "group"),
    Column("cases", "cases", _fmt_int),
    Column("cpu_s", "cpu s", _fmt_float(2)),
    Column("wall_s", "wall s", _fmt_float(2)),
    Column("first_cpu_s", "first case cpu s", _fmt_float(2)),
    Column("share_cpu_s", "cpu s / case", _fmt_float(2)),
    Column("power_min", "power min", _fmt_float(4)),
    Column("n_max", "N max", _fmt_int),
    Column("status", "status"),
]


def add_checks_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="ci", help="Hypothesis profile and sample scale: ci (default), dev, thorough")
    p.add_argument("--names", nargs="+", default=None, metavar="NAME", help="only these check names (default: every registered check)")
    p.add_argument(
        "--requires",
        default=None,
        metavar="FLAG",
        help="only checks that need this capability, e.g. verifier (conformance/test_verifier.py) or decoder",
    )
    p.add_argument("--backend", default=DEFAULT_BACKEND, metavar="MODULE:FACTORY", help=f"backend factory (default {DEFAULT_BACKEND})")
    p.add_argument("--seed", type=int, default=None, help="base seed (default conformance.registry.DEFAULT_SEED)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1, as each pytest-xdist worker; CPU seconds count every thread)",
    )
    p.add_argument("--groups-only", action="store_true", help="print only the per-group table")


def _load_backend(spec: str):
    module_name, sep, attr = spec.partition(":")
    if not sep:
        raise SystemExit(f"--backend must look like 'package.module:factory', got {spec!r}")
    factory = getattr(importlib.import_module(module_name), attr)
    return factory() if callable(factory) and not hasattr(factory, "capabilities") else factory


def run_checks(args: argparse.Namespace) -> list[dict]:
    from hypothesis import settings

    from conformance.registry import DEFAULT_SEED, CHECKS, CheckContext, all_cases, run_case
    from properties import profiles

    if args.profile not in profiles.PROFILES:
        raise SystemExit(f"unknown profile {args.profile!r}; known: {', '.join(profiles.PROFILES)}")
    # the profile and thread count are process-global: restore them (this may run inside pytest)
    previous_profile = getattr(settings, "_current_profile", None) or "default"
    previous_threads = torch.get_num_threads()
    settings.load_profile(args.profile)
    torch.set_num_threads(args.threads)
    try:
        backend = _load_backend(args.backend)
        seed = DEFAULT_SEED if args.seed is None else args.seed
        try:
            cases = all_cases(args.names)
        except KeyError as exc:
            raise SystemExit(f"unknown check name {exc}; known: {', '.join(CHECKS)}") from None
        if args.requires is not None:
            cases = [c for c in cases if args.requires in c.check.requires]
        rows: list[dict] = []
        for case in cases:
            ctx = CheckContext(
                seed=seed,
                profile=args.profile,
                replay=f"specdec-bench checks --profile {args.profile} --seed {seed} --names {case.check.name}",
            )
            cpu0, wall0 = time.process_time(), time.perf_counter()
            record = run_case(case, backend, ctx)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            stats = record.statistics
            row = dict(
                id=record.id,
                check=record.check,
                group=case.group,
                statistical=case.check.statistical,
                requires=list(case.check.requires),
                status=record.status,
                cpu_s=cpu,
                wall_s=wall,
                tests=len(stats),
                n_min=min((s["n"] for s in stats), default=None),
                n_max=max((s["n"] for s in stats), default=None),
                alpha_max=max((s["alpha"] for s in stats), default=None),
                tv_max=max((s["tv"] for s in stats), default=None),
                power_min=min((s["power"] for s in stats), default=None),
                p_value_min=min((s["p_value"] for s in stats), default=None),
                message=record.message,
                statistics=stats,
            )
            rows.append(row)
            print(f"  [{row['status']:>7}] {row['id']}: {cpu:.2f} cpu s, {wall:.2f} wall s", file=sys.stderr, flush=True)
    finally:
        settings.load_profile(previous_profile)
        torch.set_num_threads(previous_threads)
    for group in group_rows(rows):
        for row in rows:
            if row["group"] == group["group"]:
                row["group_share_cpu_s"] = group["share_cpu_s"]
    return rows


def group_rows(rows: list[dict]) -> list[dict]:
    """Per shared-sample group: totals, the first case (which draws the sample) and the per-case share."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    out = []
    for name, members in groups.items():
        cpu = sum(r["cpu_s"] for r in members)
        powers = [r["power_min"] for r in members if r["power_min"] is not None]
        ns = [r["n_max"] for r in members if r["n_max"] is not None]
        statuses = sorted({r["status"] for r in members})
        out.append(
            dict(
                group=name,
                cases=len(members),
                cpu_s=cpu,
                wall_s=sum(r["wall_s"] for r in members),
                first_cpu_s=members[0]["cpu_s"],
                share_cpu_s=cpu / len(members),
                power_min=min(powers, default=None),
                n_max=max(ns, default=None),
                status="/".join(statuses),
                statistical=any(r["statistical"] for r in members),
            )
        )
    return out


def two_worker_makespan(group_seconds: Sequence[float]) -> float:
    """Longest-processing-time schedule of whole groups on 2 workers (xdist loadgroup keeps a group together)."""
    workers = [0.0, 0.0]
    for s in sorted(group_seconds, reverse=True):
        workers[workers.index(min(workers))] += s
    return max(workers)


def summarise_checks(args: argparse.Namespace, rows: list[dict]) -> list[str]:
    groups = group_rows(rows)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    total_cpu, total_wall = sum(r["cpu_s"] for r in rows), sum(r["wall_s"] for r in rows)
    lines = [
        f"totals: {len(rows)} cases ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}), "
        f"{sum(r['tests'] for r in rows)} statistical tests, {total_cpu:.1f} CPU s, {total_wall:.1f} wall s "
        f"in one process with {args.threads} thread(s)",
    ]
    for r in rows:
        if r["status"] in ("failed", "error"):
            lines.append(f"  {r['status'].upper()} {r['id']}: {r['message'].strip().splitlines()[0][:300] if r['message'].strip() else ''}")

    stat = [r for r in rows if r["statistical"] and r["status"] == "passed" and r["tests"]]
    if stat:
        weak = [r for r in stat if r["power_min"] < GOAL_POWER]
        loose = [r for r in stat if r["alpha_max"] > GOAL_ALPHA]
        other_tv = [r for r in stat if r["tv_max"] > GOAL_TV]
        slow = [r for r in stat if r["group_share_cpu_s"] > GOAL_CPU_S]
        worst_share = max(stat, key=lambda r: r["group_share_cpu_s"])
        worst_alone = max((g for g in groups if g["statistical"]), key=lambda g: g["first_cpu_s"])
        short = {r["id"] for r in weak + loose + other_tv + slow}
        lines.append(
            f"goal (each statistical check: TV {GOAL_TV} detected with power >= {GOAL_POWER} at alpha <= {GOAL_ALPHA:g} "
            f"in <= {GOAL_CPU_S:g} CPU s incl. its share of the group sample): "
            + ("MET by all " + str(len(stat)) + " passing statistical cases" if not short else f"NOT MET: {len(short)} of {len(stat)} passing statistical cases fall short")
        )
        lines.append(
            f"  smallest power {min(r['power_min'] for r in stat):.4f}, largest alpha {max(r['alpha_max'] for r in stat):g}, "
            f"largest per-case CPU share {worst_share['group_share_cpu_s']:.2f} s ({worst_share['id']}); "
            f"the costliest sample draw (first case of {worst_alone['group']}) took {worst_alone['first_cpu_s']:.2f} CPU s"
        )
        for what, bad in (
            (f"power < {GOAL_POWER}", weak),
            (f"alpha > {GOAL_ALPHA:g}", loose),
            (f"sized for a TV above {GOAL_TV}", other_tv),
            (f"CPU share > {GOAL_CPU_S:g} s", slow),
        ):
            for r in bad[:MAX_LISTED]:
                lines.append(
                    f"  {what}: {r['id']} (power {r['power_min']:.4f} against TV {r['tv_max']:g}, alpha {r['alpha_max']:g}, "
                    f"share {r['group_share_cpu_s']:.2f} CPU s)"
                )
            if len(bad) > MAX_LISTED:
                lines.append(f"  {what}: ... and {len(bad) - MAX_LISTED} more (see the table)")
    verifier_groups = [g for g in groups if any(r["group"] == g["group"] and "verifier" in r["requires"] for r in rows)]
    if verifier_groups:
        makespan = two_worker_makespan([g["wall_s"] for g in verifier_groups])
        lines.append(
            f"goal (ci profile verifier checks < {GOAL_CI_WALL_S:g} s wall with pytest -n 2): estimated {makespan:.1f} s "
            f"-> {'MET' if makespan < GOAL_CI_WALL_S else 'NOT MET'}"
            + ("" if args.profile == "ci" else f" [measured with profile {args.profile}, not ci]")
        )
    if len(verifier_groups) != len(groups):
        lines.append(f"  all selected checks: estimated {two_worker_makespan([g['wall_s'] for g in groups]):.1f} s with pytest -n 2")
    lines.append(
        "  (estimate: whole groups, LPT-scheduled on 2 one-thread workers that each have a free core, as --dist loadgroup keeps an xdist_group "
        "together; excludes pytest start-up and collection; plain -n 2 (--dist load) ignores xdist_group and may draw "
        "a scenario's sample on both workers)"
    )
    return lines


def checks_header(args: argparse.Namespace) -> list[str]:
    return [
        f"conformance checks on {args.backend}, profile {args.profile}, torch threads {args.threads}"
        + (f", only checks requiring {args.requires!r}" if args.requires else "")
        + "; "
        "cpu s = time.process_time() around run_case; 'share s' = its group's CPU total / cases in the group "
        "(the group's first case draws the shared sample)"
    ]


def print_checks(args: argparse.Namespace, rows: list[dict], out) -> None:
    if not args.groups_only:
        print(format_table(rows, CHECK_COLUMNS), file=out)
        print(file=out)
    print("per shared-sample group:", file=out)
    print(format_table(group_rows(rows), GROUP_COLUMNS), file=out)


# ----------------------------------------------------------------------------- decoder


#: The project's goal for the decoder: our speculative decoder at >= this many times the throughput of
#: transformers' assisted generation on the same pair and settings.
GOAL_VS_HF_ASSISTED = 2.0
#: ar: the oracle (transformers forward); ar-lean: the same with the spec decoder's own cache/forward
#: (``make_cache=fastest_cache``); hf-ar: plain ``target.generate`` (greedy or sampling, no assistant).
DECODER_VARIANTS = ("ar", "ar-lean", "spec", "hf-assisted", "hf-ar")
_NO_K = ("ar", "ar-lean", "hf-ar")


def _fmt_share(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.0f}"


DECODER_COLUMNS = [
    Column("mode", "mode"),
    Column("label", "variant"),
    Column("tokens_per_s_median", "tok/s med", _fmt_float(0)),
    Column("tokens_per_s_p10", "p10", _fmt_float(0)),
    Column("tokens_per_s_p90", "p90", _fmt_float(0)),
    Column("vs_ar", "x AR", _fmt_float(2)),
    Column("vs_ar_lean", "x lean", _fmt_float(2)),
    Column("vs_hf_assisted", "x hf(k)", _fmt_float(2)),
    Column("tokens_per_cpu_s_median", "tok/cpu-s", _fmt_float(0)),
    Column("cpu_vs_hf_assisted", "x hf(k) cpu", _fmt_float(2)),
    Column("acceptance", "accept", _fmt_float(3)),
    Column("tokens_per_round", "tok/rnd", _fmt_float(2)),
    Column("target_calls_per_100", "tgt/100", _fmt_float(1)),
    Column("draft_calls_per_100", "drf/100", _fmt_float(1)),
    Column("host_syncs_per_round", "sync/rnd", _fmt_float(2)),
    Column("draft_share", "draft%", _fmt_share),
    Column("verify_share", "verify%", _fmt_share),
    Column("repair_share", "repair%", _fmt_share),
    Column("forward_share", "fwd%", _fmt_share),
    Column("k_exact", "k exact", lambda v: "-" if v is None else ("yes" if v else "NO")),
    Column("equals_ar_text", "= AR"),
    Column("equals_hf_text", "= hf(k)"),
]


def add_decoder_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mode",
        type=choice_list("greedy", "sampling"),
        default=["greedy", "sampling"],
        help="greedy,sampling (default both; sampling = temperature 1, no top-k/top-p)",
    )
    p.add_argument("--k", type=int_list, default=list(range(1, 9)), help="draft lengths for spec and hf-assisted (default 1,2,3,4,5,6,7,8)")
    p.add_argument("--new-tokens", type=int, default=128, help="new tokens per prompt (default 128; prompt + new tokens <= 256)")
    p.add_argument("--prompts", type=int, default=4, help="prompts from sample_prompts(n, length, seed=0) (default 4)")
    p.add_argument("--prompt-length", type=int, default=64, help="prompt length in bytes (default 64)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved timed repeats, rotating the variant order (default 5)")
    p.add_argument(
        "--variants",
        type=choice_list(*DECODER_VARIANTS),
        default=list(DECODER_VARIANTS),
        help=f"{','.join(DECODER_VARIANTS)} (default all; ar is the reference of the x AR column and of the greedy equality check)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument(
        "--seed", type=int, default=0, help="base seed of the sampling generators (one seed per repeat and prompt, shared by the variants)"
    )


class _ForwardProbe:
    """Forward calls of one transformers model: (input length, cache length) per call, wall seconds inside them.

    A pre/post hook pair on the top-level module, installed for every variant alike (about a microsecond
    per call against a forward of a few hundred). It sees the calls that go through the module
    (transformers ``generate``, ``ModelCache``), not the lean static forward of ``StaticModelCache``,
    which uses the weights directly. The cache length (``cache.get_seq_length()``) lets the benchmark
    recover how many tokens transformers' assisted generation drafted each round.
    """

    def __init__(self, model: torch.nn.Module):
        self.reset()
        self._t0 = 0.0
        self._handles = [
            model.register_forward_pre_hook(self._pre, with_kwargs=True),
            model.register_forward_hook(self._post),
        ]

    def reset(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.seconds = 0.0

    def _pre(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("cache")
        self.calls.append((0 if ids is None else int(ids.shape[-1]), 0 if cache is None else int(cache.get_seq_length())))
        self._t0 = time.perf_counter()

    def _post(self, module, args, output):
        self.seconds += time.perf_counter() - self._t0

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def hf_assisted_drafts(target_calls: Sequence[tuple[int, int]], prompt_len: int) -> list[tuple[int, int]]:
    """(drafted, cur_len) per round of transformers' assisted generation, from the target's forward calls.

    Round ``r`` is target call ``r``: the first feeds prompt + candidates on an empty cache, later ones
    ``[last token, candidates]`` on a cache of ``cur_len - 1`` tokens (``cur_len`` = committed length
    the round starts from). The expected draft is ``min(k, max_length - cur_len - 1)``, as in
    ``AssistedCandidateGenerator._calculate_new_tokens``.
    """
    out = []
    for inputs, cached in target_calls:
        cur_len = prompt_len if cached == 0 else cached + 1
        out.append((cached + inputs - cur_len, cur_len))
    return out


def _decoder_seed(base: int, repeat: int, prompt: int) -> int:
    return base * 1_000_003 + (repeat + 1) * 1_009 + prompt


@dataclass
class _DecoderVariant:
    name: str  # one of DECODER_VARIANTS
    k: int | None

    @property
    def label(self) -> str:
        return self.name if self.k is None else f"{self.name} k={self.k}"


def _decoder_call(variant: _DecoderVariant, target, draft, prompt, *, new_tokens: int, sampling, seed: int, probes) -> dict:
    """One generation: tokens, wall and CPU seconds, and the per-call counters of every variant."""
    from transformers import GenerationConfig

    from .decode import SpeculativeDecoder, autoregressive_decode
    from .static_cache import fastest_cache

    for probe in probes.values():
        probe.reset()
    prompt_len = prompt.shape[1]
    record: dict[str, Any] = {}
    if variant.name in ("ar", "ar-lean", "spec"):
        generator = torch.Generator().manual_seed(seed)
        decoder = SpeculativeDecoder() if variant.name == "spec" else None
        ar_options = dict(make_cache=fastest_cache) if variant.name == "ar-lean" else {}
        c0, t0 = time.process_time(), time.perf_counter()
        if decoder is None:
            result = autoregressive_decode(target, prompt, max_new_tokens=new_tokens, sampling=sampling, generator=generator, **ar_options)
        else:
            result = decoder.decode(
                target, draft, prompt, k=variant.k, max_new_tokens=new_tokens, sampling=sampling, generator=generator, timed=True
            )
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        tokens = list(result.tokens)
        hooked = (len(probes["target"].calls), len(probes["draft"].calls))
        if hooked != (0, 0) and hooked != (result.target_calls, result.draft_calls):
            raise RuntimeError(
                f"{variant.label}: the decoder counted {result.target_calls}/{result.draft_calls} target/draft calls, "
                f"the forward hooks {hooked[0]}/{hooked[1]}"
            )
        record.update(
            target_calls=result.target_calls,
            draft_calls=result.draft_calls,
            host_syncs=result.host_syncs,
            phases=dict(result.seconds),
            # None where the lean static forward bypasses the transformers module (and its hooks)
            forward_seconds=probes["target"].seconds + probes["draft"].seconds if hooked != (0, 0) else None,
        )
        if variant.name == "spec":
            rounds = result.rounds
            record.update(
                rounds=len(rounds),
                proposed=sum(r.proposed for r in rounds),
                accepted=sum(r.accepted for r in rounds),
                k_exact=all(r.proposed == min(variant.k, new_tokens - (r.start - prompt_len) - 1) for r in rounds),
            )
        else:
            record.update(rounds=len(tokens))  # one target call, one host sync per token
    else:
        options: dict[str, Any] = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0, eos_token_id=None)
        if sampling.greedy:
            options.update(do_sample=False)
        else:  # top_k=None would make transformers fill in its default top_k=50
            options.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or 0, top_p=sampling.top_p or 1.0)
        assistant = None
        if variant.name == "hf-assisted":
            # transformers 5.24's AssistedCandidateGenerator reads these three from the *assistant's*
            # generation_config, not from the one passed to generate (where they are silently ignored;
            # unset they default to 20 tokens and a 0.4 confidence early stop). A threshold of 0 adds no
            # ConfidenceCriteria and skips the (sklearn) threshold adaptation: k drafts every round.
            pin = dict(num_assistant_tokens=variant.k, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
            for key, value in pin.items():
                setattr(draft.generation_config, key, value)
            options.update(pin)
            assistant = draft
        config = GenerationConfig(**options)
        mask = torch.ones_like(prompt)
        torch.manual_seed(seed)  # transformers samples from the global generator
        c0, t0 = time.process_time(), time.perf_counter()
        if assistant is None:
            out = target.generate(prompt, attention_mask=mask, generation_config=config)
        else:
            out = target.generate(prompt, attention_mask=mask, assistant_model=assistant, generation_config=config)
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        tokens = out[0, prompt_len:].tolist()
        record.update(
            rounds=len(probes["target"].calls),
            target_calls=len(probes["target"].calls),
            draft_calls=len(probes["draft"].calls),
            host_syncs=None,
            phases=None,
            forward_seconds=probes["target"].seconds + probes["draft"].seconds,
        )
        if assistant is not None:
            drafts = hf_assisted_drafts(probes["target"].calls, prompt_len)
            max_length = prompt_len + new_tokens
            record.update(
                proposed=sum(d for d, _ in drafts),
                accepted=len(tokens) - len(drafts),  # each round commits its matches + 1 (no EOS, no budget cut)
                k_exact=all(d == min(variant.k, max_length - cur - 1) for d, cur in drafts),
            )
    if len(tokens) != new_tokens:
        raise RuntimeError(f"{variant.label} generated {len(tokens)} tokens, expected {new_tokens}")
    record.update(tokens=tokens, seconds=seconds, cpu_seconds=cpu_seconds)
    return record


def run_decoder(args: argparse.Namespace) -> list[dict]:
    import copy

    from .pretrained import CONTEXT_LENGTH, load_trained_pair, sample_prompts
    from .warp import GREEDY, SamplingConfig

    if args.prompt_length + args.new_tokens > CONTEXT_LENGTH:
        raise SystemExit(f"--prompt-length {args.prompt_length} + --new-tokens {args.new_tokens} exceeds the pair's context {CONTEXT_LENGTH}")
    if min(args.k, default=1) < 1 or args.new_tokens < 1 or args.prompts < 1 or args.repeats < 1:
        raise SystemExit("--k, --new-tokens, --prompts and --repeats must be >= 1")
    variants = [
        _DecoderVariant(name, k)
        for name in DECODER_VARIANTS
        if name in args.variants
        for k in ((None,) if name in _NO_K else args.k)
    ]
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    target, draft = load_trained_pair()
    draft_config = copy.deepcopy(draft.generation_config)
    probes = {"target": _ForwardProbe(target), "draft": _ForwardProbe(draft)}
    prompts = sample_prompts(args.prompts, length=args.prompt_length, seed=0)
    rows: list[dict] = []
    try:
        for mode in args.mode:
            sampling = GREEDY if mode == "greedy" else SamplingConfig(temperature=1.0)
            call = lambda v, i, r: _decoder_call(  # noqa: E731
                v, target, draft, prompts[i], new_tokens=args.new_tokens, sampling=sampling,
                seed=_decoder_seed(args.seed, r, i), probes=probes,
            )  # fmt: skip
            for v in variants:  # warm-up: every variant once (lazy init, allocator, transformers' first generate)
                call(v, 0, -1)
            runs: dict[str, list[list[dict]]] = {v.label: [] for v in variants}  # label -> repeat -> prompt
            for r in range(args.repeats):
                for v in variants:
                    runs[v.label].append([])
                for i in range(len(prompts)):  # every variant on one prompt, then the next: compared runs stay seconds apart
                    shift = (r * len(prompts) + i) % len(variants)
                    for v in variants[shift:] + variants[:shift]:
                        runs[v.label][r].append(call(v, i, r))
                print(f"  [{mode}] repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
            mode_rows = _decoder_rows(mode, variants, runs, args)
            for row in mode_rows:
                row["load_average"] = load_average()
            rows.extend(mode_rows)
    finally:
        for probe in probes.values():
            probe.remove()
        draft.generation_config = draft_config
        torch.set_num_threads(previous_threads)
    return rows


def _decoder_rows(mode: str, variants: list[_DecoderVariant], runs: dict[str, list[list[dict]]], args) -> list[dict]:
    reference = runs.get("ar")
    rows = []
    for v in variants:
        reps = runs[v.label]
        flat = [rec for rep in reps for rec in rep]
        tokens = sum(len(x["tokens"]) for x in flat)
        wall = [sum(x["seconds"] for x in rep) for rep in reps]
        rates = [sum(len(x["tokens"]) for x in rep) / w for rep, w in zip(reps, wall)]
        cpu_rates = [sum(len(x["tokens"]) for x in rep) / sum(x["cpu_seconds"] for x in rep) for rep in reps]
        rounds = sum(x["rounds"] for x in flat)
        row: dict[str, Any] = dict(
            mode=mode,
            variant=v.name,
            k=v.k,
            label=v.label,
            prompts=args.prompts,
            prompt_length=args.prompt_length,
            new_tokens=args.new_tokens,
            repeats=len(reps),
            threads=args.threads,
            tokens_per_s=rates,
            tokens_per_s_median=percentile(rates, 50),
            tokens_per_s_p10=percentile(rates, 10),
            tokens_per_s_p90=percentile(rates, 90),
            tokens_per_cpu_s=cpu_rates,
            tokens_per_cpu_s_median=percentile(cpu_rates, 50),
            acceptance=None,
            tokens_per_round=tokens / rounds if rounds else None,
            target_calls_per_100=100 * sum(x["target_calls"] for x in flat) / tokens,
            draft_calls_per_100=100 * sum(x["draft_calls"] for x in flat) / tokens,
            host_syncs_per_round=None,
            forward_share=None,
            k_exact=None,
        )
        if all(x["forward_seconds"] is not None for x in flat):
            row["forward_share"] = percentile([sum(x["forward_seconds"] for x in rep) / w for rep, w in zip(reps, wall)], 50)
        if flat[0].get("proposed") is not None:
            proposed = sum(x["proposed"] for x in flat)
            row["acceptance"] = sum(x["accepted"] for x in flat) / proposed if proposed else None
            row["k_exact"] = all(x["k_exact"] for x in flat)
        if flat[0]["host_syncs"] is not None:
            row["host_syncs_per_round"] = sum(x["host_syncs"] for x in flat) / rounds
        for phase in ("prefill", "draft", "verify", "repair"):
            row[f"{phase}_share"] = None
            if flat[0]["phases"]:
                row[f"{phase}_share"] = percentile([sum(x["phases"][phase] for x in rep) / w for rep, w in zip(reps, wall)], 50)
        if reference is not None and mode == "greedy":
            pairs = [(x["tokens"], ref["tokens"]) for rep, ref_rep in zip(reps, reference) for x, ref in zip(rep, ref_rep)]
            equal = sum(a == b for a, b in pairs)
            diverge = [next(i for i, (s, t) in enumerate(zip(a, b)) if s != t) for a, b in pairs if a != b]
            row.update(equal_runs=equal, runs=len(pairs), equals_ar=equal == len(pairs), first_divergence=min(diverge, default=None))
            row["equals_ar_text"] = "ref" if v.name == "ar" else ("yes" if equal == len(pairs) else f"NO {equal}/{len(pairs)}")
        else:
            row["equals_ar"] = None
            row["equals_ar_text"] = "-"
        rows.append(row)
    by_label = {r["label"]: r for r in rows}
    ar, lean = by_label.get("ar"), by_label.get("ar-lean")
    for row in rows:
        hf = by_label.get(f"hf-assisted k={row['k']}") if row["variant"] == "spec" else None
        row["equals_hf_text"] = "-"
        if hf:  # same k, same prompt, same seed (sampling: transformers draws from the global generator seeded alike)
            pairs = [(x["tokens"], y["tokens"]) for rep, hf_rep in zip(runs[row["label"]], runs[hf["label"]]) for x, y in zip(rep, hf_rep)]
            equal = sum(a == b for a, b in pairs)
            row.update(equal_hf_runs=equal, runs_hf=len(pairs), equals_hf=equal == len(pairs))
            row["equals_hf_text"] = "yes" if equal == len(pairs) else f"NO {equal}/{len(pairs)}"
        for key, ref in (("ar", ar), ("ar_lean", lean), ("hf_assisted", hf)):
            row[f"vs_{key}"] = row["tokens_per_s_median"] / ref["tokens_per_s_median"] if ref else None
            row[f"cpu_vs_{key}"] = row["tokens_per_cpu_s_median"] / ref["tokens_per_cpu_s_median"] if ref else None
    return rows


def summarise_decoder(args: argparse.Namespace, rows: list[dict]) -> list[str]:
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        get = {r["label"]: r for r in mine}
        spec = [r for r in mine if r["variant"] == "spec"]
        hf = {r["k"]: r for r in mine if r["variant"] == "hf-assisted"}
        ar, lean = get.get("ar"), get.get("ar-lean")
        if spec:
            best = max(spec, key=lambda r: r["tokens_per_s_median"])
            line = f"{mode}: best speculative k={best['k']}: {best['tokens_per_s_median']:.0f} tok/s"
            for ref, what in ((ar, "AR (the oracle, transformers forward)"), (lean, "ar-lean (AR on the spec decoder's own lean forward)")):
                if ref:
                    key = "ar" if ref is ar else "ar_lean"
                    ratio = best[f"vs_{key}"]
                    line += (
                        f"; {ratio:.2f}x {what} at {ref['tokens_per_s_median']:.0f} tok/s -> {'faster' if ratio > 1 else 'SLOWER'}"
                        f" (by CPU time {best[f'cpu_vs_{key}']:.2f}x)"
                    )
            lines.append(line)
            same_k = [r for r in spec if r["vs_hf_assisted"] is not None]
            if same_k:
                lines.append(
                    f"{mode}: ours / hf-assisted at the same k (wall; CPU time): "
                    + ", ".join(f"k={r['k']} {r['vs_hf_assisted']:.2f}x; {r['cpu_vs_hf_assisted']:.2f}x" for r in same_k)
                )
            head = (
                f"{mode}: goal (our speculative decoder >= {GOAL_VS_HF_ASSISTED:g}x the throughput of transformers' assisted generation, "
                f"same pair and settings) at our best k={best['k']}: "
            )
            if best["vs_hf_assisted"] is None:
                lines.append(head + f"NOT MEASURED (no hf-assisted k={best['k']} row)")
            else:
                ratio = best["vs_hf_assisted"]
                verdict = "MET" if ratio >= GOAL_VS_HF_ASSISTED else "NOT MET"
                line = head + f"{ratio:.2f}x -> {verdict} (by CPU time {best['cpu_vs_hf_assisted']:.2f}x)"
                if hf:
                    hf_best = max(hf.values(), key=lambda r: r["tokens_per_s_median"])
                    line += f"; vs hf-assisted's own best k={hf_best['k']}: {best['tokens_per_s_median'] / hf_best['tokens_per_s_median']:.2f}x"
                lines.append(line)
            both = [(r, hf[r["k"]]) for r in spec if r["k"] in hf]
            if both:
                differ = [r["k"] for r, h in both if abs(r["acceptance"] - h["acceptance"]) > 1e-9]
                line = f"{mode}: acceptance ours / hf-assisted: " + ", ".join(
                    f"k={r['k']} {r['acceptance']:.3f}/{h['acceptance']:.3f}" for r, h in both
                )
                if mode == "greedy":
                    line += (
                        " -> identical at every k"
                        if not differ
                        else f" -> DIFFERENT at k={','.join(map(str, differ))} (greedy drafts are deterministic)"
                    )
                else:
                    line += " -> identical at every k" if not differ else f" -> differ at k={','.join(map(str, differ))}"
                lines.append(line)
                same = [r for r, _ in both if r.get("equals_hf")]
                runs_hf = sum(r["runs_hf"] for r, _ in both)
                lines.append(
                    f"{mode}: ours equals hf-assisted token for token (same k, prompt and seed): "
                    + (f"yes, all {runs_hf} runs" if len(same) == len(both) else f"at k={','.join(str(r['k']) for r in same) or 'none'} only; "
                       + ", ".join(f"k={r['k']} {r['equal_hf_runs']}/{r['runs_hf']}" for r, _ in both if not r.get("equals_hf")))
                    + ("" if mode == "greedy" else " (both draw from torch generators seeded alike: equality means the same random-stream use)")
                )
        for name, what in (("ar-lean", "ar-lean (AR on the lean static forward)"), ("hf-ar", "hf-ar (plain transformers generate)")):
            if name in get and ar:
                row = get[name]
                lines.append(
                    f"{mode}: {what} {row['tokens_per_s_median']:.0f} tok/s = {row['vs_ar']:.2f}x AR (by CPU time {row['cpu_vs_ar']:.2f}x)"
                )
        pinned = [r for r in hf.values() if not r["k_exact"]]
        if hf:
            lines.append(
                f"{mode}: hf-assisted drafted exactly min(k, tokens left - 1) tokens every round: "
                + ("yes, at every k" if not pinned else "NO at k=" + ",".join(str(r["k"]) for r in pinned))
            )
        if mode == "greedy" and ar:
            unequal = [r for r in mine if r["equals_ar"] is False]
            runs = sum(r["runs"] for r in mine if r["variant"] != "ar")
            lines.append(
                f"{mode}: every output equals AR token for token ({runs} runs)"
                if not unequal
                else f"{mode}: NOT EQUAL to AR: "
                + ", ".join(
                    f"{r['label']} ({r['runs'] - r['equal_runs']}/{r['runs']} runs, first divergence at token {r['first_divergence']})"
                    for r in unequal
                )
            )
    return lines


def decoder_header(args: argparse.Namespace) -> list[str]:
    return [
        f"decoders on the shipped pair (target Llama 2x128, draft Qwen2 1x64, V=256), {args.prompts} prompt(s) of {args.prompt_length} bytes, "
        f"{args.new_tokens} new tokens each, torch threads {args.threads}; after one warm-up call per variant, {args.repeats} repeats in which "
        "the variants run interleaved over the same prompts (all variants on one prompt, then the next; rotating order)",
        "variants: ar = autoregressive_decode (the oracle, transformers forward); ar-lean = the same with make_cache=fastest_cache (the "
        "spec decoder's static-cache lean forward); spec = SpeculativeDecoder().decode; hf-assisted = target.generate(assistant_model=draft), "
        "pinned to k drafts per round through the draft's generation_config; hf-ar = target.generate without assistant",
        "tok/s = new tokens / wall s of the variant's calls in one repeat, median (p10, p90) over repeats; x AR, x lean, x hf(k) = ratios "
        "of medians; tok/cpu-s, x hf(k) cpu: the same with process CPU seconds (robust to other load on a shared machine); "
        "accept = accepted / drafted; tgt/100, drf/100 = model forward calls per 100 new tokens; draft/verify/repair% = median share "
        "of the wall time (timed=True phases, ours only); fwd% = share inside transformers module forwards (hooks; '-' for the lean "
        "forward, which bypasses them); k exact = every round drafted min(k, tokens left - 1); = AR (greedy), = hf(k): token-for-token "
        "equality with ar / with hf-assisted at the same k, prompt and seed",
    ]


# ----------------------------------------------------------------------------- command line


@dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], list[dict]]
    columns: Sequence[Column] = ()
    summarise: Callable[[argparse.Namespace, list[dict]], list[str]] = lambda args, rows: []
    header: Callable[[argparse.Namespace], list[str]] = lambda args: []
    #: custom table output; default: one table of ``columns``
    print_rows: Callable[[argparse.Namespace, list[dict], Any], None] | None = None
    #: exit status from the rows (e.g. 1 when a check failed)
    exit_status: Callable[[list[dict]], int] = lambda rows: 0


SUBCOMMANDS: dict[str, Subcommand] = {
    s.name: s
    for s in (
        Subcommand(
            "verifier",
            "throughput of the reference block verifier (blocks/s) over a B x k x V x mode grid",
            add_verifier_arguments,
            run_verifier,
            VERIFIER_COLUMNS,
            summarise_verifier,
            verifier_header,
        ),
        Subcommand(
            "checks",
            "run every registered conformance check on a backend without pytest: CPU/wall seconds, status, power",
            add_checks_arguments,
            run_checks,
            CHECK_COLUMNS,
            summarise_checks,
            checks_header,
            print_rows=print_checks,
            exit_status=lambda rows: int(any(r["status"] in ("failed", "error") for r in rows)),
        ),
        Subcommand(
            "decoder",
            "tokens/s of AR, our speculative decoder and transformers' assisted generation on the shipped trained pair",
            add_decoder_arguments,
            run_decoder,
            DECODER_COLUMNS,
            summarise_decoder,
            decoder_header,
        ),
    )
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec-bench", description=__doc__.split("\n\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", metavar="PATH", default=None, help="also write the rows, summary and environment as JSON")
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for s in SUBCOMMANDS.values():
        p = sub.add_parser(s.name, help=s.help, description=s.help, parents=[common])
        s.add_arguments(p)
    return parser


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def main(argv: Sequence[str] | None = None, out=None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    sub = SUBCOMMANDS[args.command]
    env = environment()
    load_before = load_average()
    started = time.perf_counter()
    rows = sub.run(args)
    elapsed = time.perf_counter() - started
    load_after = load_average()
    summary = sub.summarise(args, rows)

    print(f"specdec-bench {sub.name}", file=out)
    print(
        f"torch {env['torch']}, python {env['python']}, {env['cpu_count']} CPUs, "
        f"cuda {'available: ' + str(env['cuda_device']) if env['cuda_available'] else 'not available'}",
        file=out,
    )
    print(f"load average (1/5/15 min): before {load_before}, after {load_after}; run took {elapsed:.1f} s", file=out)
    for line in sub.header(args):
        print(line, file=out)
    print(file=out)
    if sub.print_rows:
        sub.print_rows(args, rows, out)
    else:
        print(format_table(rows, sub.columns), file=out)
    if summary:
        print(file=out)
        for line in summary:
            print(line, file=out)

    if args.json:
        payload = {
            "command": sub.name,
            "argv": list(argv) if argv is not None else sys.argv[1:],
            "args": {k: v for k, v in vars(args).items()},
            "environment": env,
            "load_average": {"before": load_before, "after": load_after},
            "seconds": elapsed,
            "rows": rows,
            "summary": summary,
        }
        if sub.name == "checks":
            payload["groups"] = group_rows(rows)
        with open(args.json, "w") as fh:
            json.dump(_jsonable(payload), fh, indent=2)
        print(f"wrote {args.json}", file=out)
    return sub.exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
