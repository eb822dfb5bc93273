"""``specdec-bench profile-engine ... --contexts 256,1024,2048,4000``: does an engine's speculation pay as the context
grows?

One engine profile (:mod:`specdec_bench.profile_engine`: paired, interleaved, bootstrap intervals) per prompt length,
each its own run (the engines loaded for it), and one table: per context the verdict line, AR's seconds per token,
the best variant with its interval and acceptance, and the **cost terms**: a round of k drafts takes
``R_k = (seconds per token) x (tokens per round)``; over the variants at two or more k, the least-squares line
``R_k = v + c k``, in units of AR's seconds per token (one target step with its overhead): ``v`` what the verify
step costs, ``c`` what one draft token costs. Speculation at k pays when its tokens per round exceed ``v + c k``.
The times are the engine's decode-only ones (first to last token, from its own timestamps) where every call has
them, else the tool's wall time (prefill included, which a long prompt dominates: said in the table).
"""
from __future__ import annotations

import argparse
from typing import Callable

from .kit import Column, format_table

__all__ = ["cost_terms", "context_row", "run_contexts", "sections", "CONTEXT_COLUMNS"]


def cost_terms(report: dict) -> dict | None:
    """``{"verify", "draft", "basis", "points"}`` fitted to a profile report's speculative rows with a known tokens per
    round (see the module docstring), or None with fewer than two distinct k."""
    decode = all(r.get("decode_per_token") for r in report["rows"]) and report["ar"].get("decode_per_token")
    key = "decode_per_token" if decode else "per_token"
    unit = report["ar"][key]
    points = []
    for r in report["rows"]:
        tpr = (r.get("acceptance") or {}).get("tokens_per_round")
        if r.get("k") and tpr and r.get(key):
            points.append((int(r["k"]), r[key] * tpr / unit))
    if len({k for k, _ in points}) < 2:
        return None
    n = len(points)
    mk, mr = sum(k for k, _ in points) / n, sum(r for _, r in points) / n
    slope = sum((k - mk) * (r - mr) for k, r in points) / sum((k - mk) ** 2 for k, _ in points)
    return {"verify": mr - slope * mk, "draft": slope, "basis": "decode" if decode else "wall",
            "points": [{"k": k, "round": r} for k, r in points]}


def context_row(length: int, report: dict) -> dict:
    """One context's line: the verdict, AR's time per token, the best variant and its acceptance, the cost terms."""
    best = max(report["rows"], key=lambda r: r["measured"])
    acc = best.get("acceptance") or {}
    costs = cost_terms(report)
    decode = (best.get("decode") or {})
    return {"context": length, "verdict": report["verdict"].split(":")[0],
            "ar_ms": 1e3 * (report["ar"].get("decode_per_token") or report["ar"]["per_token"]),
            "best": best["variant"], "wall": f"{best['measured']:.2f}x [{best['low']:.2f}, {best['high']:.2f}]",
            "decode": f"{decode['value']:.2f}x [{decode['low']:.2f}, {decode['high']:.2f}]" if decode else "-",
            "alpha": acc.get("alpha"), "tokens_per_round": acc.get("tokens_per_round"),
            "verify": None if costs is None else costs["verify"], "draft": None if costs is None else costs["draft"],
            "basis": "-" if costs is None else costs["basis"]}


def _f(digits: int):
    return lambda v: "-" if v is None else f"{v:.{digits}f}"


CONTEXT_COLUMNS = [
    Column("context", "prompt tokens"), Column("verdict", "verdict"), Column("ar_ms", "AR ms/token", _f(2)),
    Column("best", "best"), Column("wall", "speedup, wall [95% CI]"), Column("decode", "decode only [95% CI]"),
    Column("alpha", "alpha", _f(3)), Column("tokens_per_round", "tokens/round", _f(2)),
    Column("verify", "verify cost v", _f(2)), Column("draft", "draft cost c", _f(3)), Column("basis", "fitted on"),
]


def run_contexts(args: argparse.Namespace, run_one: Callable[[argparse.Namespace], dict]) -> dict:
    """``run_one`` (one profile report) at every ``args.contexts`` prompt length, and the combined report."""
    reports = []
    for length in args.contexts:
        reports.append(run_one(argparse.Namespace(**{**vars(args), "prompt_length": int(length), "contexts": None})))
    rows = [context_row(length, r) for length, r in zip(args.contexts, reports)]
    first = reports[0]
    return {"title": f"{first['title']}: contexts {', '.join(str(c) for c in args.contexts)}", "kind": "contexts",
            "verdict": "; ".join(f"{r['context']}: {rep['verdict']}" for r, rep in zip(rows, reports)),
            "context_rows": rows, "reports": reports, "rows": [row for rep in reports for row in rep["rows"]]}


def sections(report: dict) -> list[tuple[str, list[str], str | None]]:
    """The combined report's text: the verdict per context, the table, each context's own verdict line."""
    first = report["reports"][0]
    return [
        ("Verdict per context", [f"{r['context']} prompt tokens: {rep['verdict']}"
                                 for r, rep in zip(report["context_rows"], report["reports"])], None),
        ("Setup", [f"pair: {first['pair']}", first["design"],
                   "every context is its own run; cost terms: R_k = time per token x tokens per round = v + c k, in AR "
                   "time-per-token units (module specdec_bench.profile_contexts)"], None),
        ("Contexts", ["AR ms/token: decode only where the engine reports token timestamps, else wall"],
         format_table(report["context_rows"], CONTEXT_COLUMNS)),
    ]
