"""``specdec-bench checks``: the cost of the conformance checks, run on a backend without pytest.

Every registered check case (or a selection) runs through :func:`conformance.registry.run_case`
under a suite profile, with CPU and wall seconds per case and per shared-sample group, the status,
and the stated power / N / alpha of the statistical ones; the summary gives the verdicts against
the project's goals for the statistical checks and the ci run.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import torch

from conformance.backends import DEFAULT_BACKEND, ENTRY_POINT_GROUP, BackendLoadError, load_backend
from conformance.profiles import DEFAULT_PROFILE, DEFAULT_SEED, PROFILES, use_profile
from conformance.registry import CHECKS, CheckContext, all_cases, run_case

from .kit import Column, Subcommand, columns, fmt_float, fmt_g, fmt_int, format_table

#: The project's goals for the statistical checks and the ci run.
GOAL_TV, GOAL_POWER, GOAL_ALPHA, GOAL_CPU_S = 0.003, 0.99, 1e-6, 10.0
GOAL_CI_WALL_S = 120.0
#: Cases listed per shortfall in the checks summary (the table has them all).
MAX_LISTED = 8


CHECK_COLUMNS = [
    *columns(id="case", status="status"),
    *columns(fmt_float(2), cpu_s="cpu s", wall_s="wall s"),
    *columns(fmt_int, tests="tests", n_min="N min"),
    *columns(fmt_g, alpha_max="alpha max", tv_max="tv"),
    Column("power_min", "power min", fmt_float(4)),
    Column("p_value_min", "p min", fmt_g),
    Column("group_share_cpu_s", "share s", fmt_float(2)),
]

GROUP_COLUMNS = [
    Column("group", "group"),
    Column("cases", "cases", fmt_int),
    *columns(fmt_float(2), cpu_s="cpu s", wall_s="wall s", first_cpu_s="first case cpu s", share_cpu_s="cpu s / case"),
    Column("power_min", "power min", fmt_float(4)),
    Column("n_max", "N max", fmt_int),
    Column("status", "status"),
]


def add_checks_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"Hypothesis profile and sample scale: {', '.join(PROFILES)} (default {DEFAULT_PROFILE})",
    )
    p.add_argument("--names", nargs="+", default=None, metavar="NAME", help="only these check names (default: every registered check)")
    p.add_argument(
        "--requires",
        default=None,
        metavar="FLAG",
        help="only checks that need this capability, e.g. verifier (conformance/test_verifier.py) or decoder",
    )
    p.add_argument(
        "--backend",
        default=DEFAULT_BACKEND,
        metavar="MODULE:FACTORY|NAME",
        help=f"backend factory or a registered backend name ({ENTRY_POINT_GROUP} entry points, e.g. hf-verifier); default {DEFAULT_BACKEND}",
    )
    p.add_argument("--seed", type=int, default=None, help=f"base seed (default conformance.profiles.DEFAULT_SEED = {DEFAULT_SEED})")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1, as each pytest-xdist worker; CPU seconds count every thread)",
    )
    p.add_argument("--groups-only", action="store_true", help="print only the per-group table")
    p.add_argument("--top", type=int, default=None, metavar="N",
                   help="print only the N costliest cases (by CPU seconds, largest first) and their share of the total")


def run_checks(args: argparse.Namespace) -> list[dict]:
    if args.profile not in PROFILES:
        raise SystemExit(f"unknown profile {args.profile!r}; known: {', '.join(PROFILES)}")
    # the profile and thread count are process-global: restore them (this may run inside pytest)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        with use_profile(args.profile):
            try:
                backend = load_backend(args.backend)
            except BackendLoadError as exc:
                raise SystemExit(f"error: {exc}") from None
            seed = DEFAULT_SEED if args.seed is None else args.seed
            try:
                cases = all_cases(args.names)
            except KeyError as exc:
                raise SystemExit(f"unknown check name {exc}; known: {', '.join(CHECKS)}") from None
            if args.requires is not None:
                cases = [c for c in cases if args.requires in c.check.requires]
            rows = [_run_one(case, backend, args, seed) for case in cases]
    finally:
        torch.set_num_threads(previous_threads)
    for group in group_rows(rows):
        for row in rows:
            if row["group"] == group["group"]:
                row["group_share_cpu_s"] = group["share_cpu_s"]
    return rows


def _run_one(case, backend, args: argparse.Namespace, seed: int) -> dict:
    """One case through ``run_case``, timed in CPU and wall seconds: its table row."""
    ctx = CheckContext(
        seed=seed,
        profile=args.profile,
        replay=f"specdec-bench checks --backend {args.backend} --profile {args.profile} --seed {seed} --names {case.check.name}",
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
    print(f"  [{row['status']:>7}] {row['id']}: {cpu:.2f} cpu s, {wall:.2f} wall s", file=sys.stderr, flush=True)
    return row


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
        if r["status"] in ("failed", "error", "inconclusive"):
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


def top_rows(rows: list[dict], n: int) -> list[dict]:
    """The ``n`` costliest cases by CPU seconds, largest first, each with its share of the selection's CPU total."""
    total = sum(r["cpu_s"] for r in rows) or 1.0
    ranked = sorted(rows, key=lambda r: r["cpu_s"], reverse=True)[:n]
    running = 0.0
    out = []
    for r in ranked:
        running += r["cpu_s"]
        out.append(dict(r, cpu_share=r["cpu_s"] / total, cumulative_share=running / total))
    return out


TOP_COLUMNS = [
    *columns(id="case", status="status"),
    *columns(fmt_float(2), cpu_s="cpu s", wall_s="wall s"),
    *columns(fmt_float(3), cpu_share="share", cumulative_share="cumulative"),
]


def print_checks(args: argparse.Namespace, rows: list[dict], out) -> None:
    if getattr(args, "top", None):
        print(f"the {args.top} costliest cases of {len(rows)} ({sum(r['cpu_s'] for r in rows):.1f} CPU s in all):", file=out)
        print(format_table(top_rows(rows, args.top), TOP_COLUMNS), file=out)
        return
    if not args.groups_only:
        print(format_table(rows, CHECK_COLUMNS), file=out)
        print(file=out)
    print("per shared-sample group:", file=out)
    print(format_table(group_rows(rows), GROUP_COLUMNS), file=out)


SUBCOMMAND = Subcommand(
    "checks",
    "run every registered conformance check on a backend without pytest: CPU/wall seconds, status, power",
    add_checks_arguments,
    run_checks,
    CHECK_COLUMNS,
    summarise_checks,
    checks_header,
    print_rows=print_checks,
    exit_status=lambda rows: int(any(r["status"] in ("failed", "error", "inconclusive") for r in rows)),
    json_extra=lambda rows: {"groups": group_rows(rows)},
)
