"""Context scaling: the paired speedup at one k as the prompt grows, with acceptance, the forward costs' growth,
the KV caches' bytes (formula beside what the caches hold) and the process's peak memory.

Every context length runs the same protocol as the main profile (:func:`specdec_bench.profile_timing.run_paired`:
warm-up dropped, interleaved repeats, paired ratios with a bootstrap interval) at a fixed number of new tokens.
Lengths the models' positions cannot hold (context + new tokens + k + 1) are dropped and listed.
"""
from __future__ import annotations

from typing import Callable, Sequence

from .profile_memory import kv_formula_bytes, memory_snapshot, reset_device_peak
from .profile_model import drafter_module, least_interfered, measure_costs
from .profile_stats import paired_ratio
from .profile_timing import acceptance_by_position, by_unit, run_paired

__all__ = ["context_sweep"]


def context_sweep(backend, target, draft, *, contexts: Sequence[int], k: int, make_units: Callable[[int], list], new_tokens: int,
                  sampling, repeats: int, max_positions: int, cost_seconds: float, seed: int = 0, log=None,
                  baseline=None, measure=measure_costs) -> dict:
    """One row per context length that fits (module docstring); ``make_units(length)`` gives the units' prompts."""
    fits = [c for c in contexts if not max_positions or c + new_tokens + k + 1 <= max_positions]
    dropped = [c for c in contexts if c not in fits]
    rows = []
    for c in fits:
        units = make_units(c)
        reset_device_peak()
        before = measure(target, draft, units[0], [k], context=c + new_tokens // 2, seconds=cost_seconds)
        runs = run_paired(backend, target, draft, [k], units, new_tokens=new_tokens, sampling=sampling, repeats=repeats, seed=seed,
                          **({} if baseline is None else {"baseline": baseline}))
        label = f"spec k={k}"
        ratio = paired_ratio(by_unit(runs["ar"], len(units), lambda r: r.per_token),
                             by_unit(runs[label], len(units), lambda r: r.per_token), seed=seed)
        acc = acceptance_by_position(runs[label])
        batch = len(units[0])
        costs = least_interfered(before, measure(target, draft, units[0], [k], context=c + new_tokens // 2, seconds=cost_seconds))
        held = next((w.caches for w in runs["warmup"] if w.variant.k == k and w.caches), {}) or {}
        tokens = c + new_tokens  # what the caches describe at the end (within k + 1)
        row = {
            "context": c, "speedup": ratio.value, "low": ratio.low, "high": ratio.high, "alpha": acc["alpha"],
            "tokens_per_round": acc["tokens_per_round"], "C_T": costs.target, "C_D": costs.draft, "C_V": costs.verify[k],
            "kv_target_formula": kv_formula_bytes(target, tokens, batch),
            "kv_draft_formula": kv_formula_bytes(drafter_module(draft), tokens, batch),
            "kv_target_valid": (held.get("target") or {}).get("valid"), "kv_target_allocated": (held.get("target") or {}).get("allocated"),
            "kv_draft_valid": (held.get("draft") or {}).get("valid"), "kv_draft_allocated": (held.get("draft") or {}).get("allocated"),
            **memory_snapshot(),
        }
        rows.append(row)
        if log:
            log(f"  context {c}: {ratio.text()} at k={k}")
    if rows:
        base = rows[0]
        for row in rows:
            row["C_T_growth"] = row["C_T"] / base["C_T"]
            row["C_D_growth"] = row["C_D"] / base["C_D"] if base["C_D"] else None
    return {"k": k, "new_tokens": new_tokens, "repeats": repeats, "rows": rows, "dropped": dropped, "max_positions": max_positions}
