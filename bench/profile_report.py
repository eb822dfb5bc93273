"""The profile's text: the verdict line, tables of costs, per-k measured vs predicted, phases, prefill, the
context sweep and memory; the same as Markdown, and the files (JSON, Markdown, plots) in one folder."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from .kit import Column, format_table, jsonable

__all__ = ["sections", "text_report", "markdown_report", "write_report"]


def _negative_host_work(fit: dict) -> list[str]:
    """A note when a fitted host-work term is negative: host work cannot be, so the forwards timed apart cost more
    than the same forwards inside the decodes and the term carries that difference (the predicted speedups divide
    the measured AR seconds per token, so they are unaffected)."""
    names = [n for n in ("o_ar", "o_d", "o_0", "o_verify", "o_repair", "o_other") if (fit.get(n) or 0.0) < 0]
    if not names:
        return []
    return [f"note: negative fitted host work ({', '.join(f'{n} {1e3 * fit[n]:.3f} ms' for n in names)}): the forwards timed "
            "apart cost more than inside the decodes, so these terms carry that difference, not host work; the predicted "
            "speedups use the measured AR seconds per token and stay comparable"]


def _ms(v) -> str:
    return "-" if v is None else f"{1e3 * v:.3f}"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:+.0f}%"


def _mib(v) -> str:
    return "-" if v is None else f"{v / 2**20:.2f}"


K_COLUMNS = [
    Column("k", "k"),
    Column("shown", "measured [95% CI]"),
    Column("predicted", "predicted", _x),
    Column("gap", "gap", _pct),
    Column("forward_only", "fwd-only", _x),
    Column("tokens_per_round", "tok/rnd", _x),
    Column("tokens_predicted", "pred", _x),
    Column("alpha", "alpha", lambda v: "-" if v is None else f"{v:.3f}"),
    Column("tail", "tail", _x),
    Column("round", "rnd ms", _ms),
    Column("round_predicted", "pred ms", _ms),
    Column("breakeven_alpha", "breakeven alpha", lambda v: "never" if v is None else f"{v:.2f}"),
    Column("draft_threshold", "pays if C_D/C_T <", lambda v: "none" if v is None else f"{v:.3g}"),
]
PHASE_COLUMNS = [Column("k", "k")] + [Column(p, f"{p} ms", _ms) for p in ("draft", "verify", "repair", "other", "unreported")] + [
    Column("round", "measured round ms", _ms), Column("per_token", "ms/token", _ms)]
CONTEXT_COLUMNS = [
    Column("context", "context"), Column("shown", "speedup [95% CI]"), Column("alpha", "alpha", lambda v: "-" if v is None else f"{v:.3f}"),
    Column("C_T", "C_T ms", _ms), Column("C_T_growth", "x", _x), Column("C_D", "C_D ms", _ms), Column("C_D_growth", "x", _x),
    Column("kv_target_formula", "KV tgt formula MiB", _mib), Column("kv_target_valid", "held", _mib),
    Column("kv_target_allocated", "alloc", _mib), Column("kv_draft_formula", "KV drf formula MiB", _mib),
    Column("kv_draft_valid", "held", _mib), Column("kv_draft_allocated", "alloc", _mib), Column("peak_rss_bytes", "peak RSS MiB", _mib),
]


def _interval(v, lo, hi) -> str:
    return f"{v:.2f}x [{lo:.2f}, {hi:.2f}]"


def sections(report: dict) -> list[tuple[str, list[str], str | None]]:
    """``(heading, prose lines, table or None)`` in print order."""
    s = report["settings"]
    fit, rows = report["model"]["fit"], report["model"]["rows"]
    costs = report["costs"]
    load = report["load_average"]
    out: list[tuple[str, list[str], str | None]] = []
    out.append(("Verdict", [report["verdict"]], None))
    out.append(("Setup", [
        f"backend {report['backend']}; {report['pair']}",
        f"B={s['batch']}, {s['prompts']} units, prompt {s['prompt_length']} tokens, {s['new_tokens']} new tokens, {s['mode']}, "
        f"k={','.join(map(str, s['ks']))}, {s['repeats']} interleaved repeats after one dropped warm-up, torch threads {s['threads']}",
        f"load average (1/5/15 min): before {load['before']}, after {load['after']}; run took {report['seconds']:.1f} s",
        "measured by the tool: wall time of every call, the first round / step (prefill + one round), seconds per token after it, "
        "acceptance from the round records, forward costs (reference lean forward), memory; speedups from " + report["timing"],
        "reported by the backend: " + ("per-round phases (RoundRecord.seconds)" + (", declared (phase_timings)" if report["declares_phase_timings"]
                                                                               else ", not declared (phase_timings unclaimed)")
                                      if report["phase_check"]["reported"] else "nothing (no RoundRecord.seconds)"),
    ], None))
    cv = ", ".join(f"C_V({k}) {1e3 * v:.3f} ms ({costs['r'][k]:.2f} C_T)" for k, v in costs["C_V"].items())
    out.append(("Costs", [
        f"C_T {1e3 * costs['C_T']:.3f} ms, C_D {1e3 * costs['C_D']:.3f} ms (c = {costs['c']:.3f} target forwards), {cv}; "
        f"cache at {costs['context']} tokens; each the smaller of two measurements, before and after the decodes (C_T {_ms(report['costs_measured']['before']['C_T'])} "
        f"/ {_ms(report['costs_measured']['after']['C_T'])} ms, C_D {_ms(report['costs_measured']['before']['C_D'])} / {_ms(report['costs_measured']['after']['C_D'])} ms)",
        f"AR: {1e3 * fit['ar_per_token']:.3f} ms per token = C_T + o_ar, o_ar {1e3 * fit['o_ar']:.3f} ms host work per step",
        f"fitted ({fit['source']}): o_d {1e3 * fit['o_d']:.3f} ms per drafted token, o_0 {1e3 * fit['o_0']:.3f} ms per round"
        + ("" if fit.get("o_verify") is None else f" (verify {1e3 * fit['o_verify']:.3f}, repair {1e3 * fit['o_repair']:.3f}, other {1e3 * fit['o_other']:.3f})"),
        "acceptance by draft position (pooled over k): " + ", ".join(f"a{j + 1} {a:.3f}" for j, a in enumerate(fit["acceptance_by_position"])),
        *_negative_host_work(fit),
    ], None))
    shown = [dict(r, shown=_interval(r["measured"], r["low"], r["high"])) for r in rows]
    notes = [f"k={r['k']}: off by {100 * r['gap']:+.0f}%: {r['term_off']}" for r in rows if r["term_off"]]
    out.append(("Speedup per k: measured beside the cost model", [
        "measured = median over units of the per-unit median paired ratio (AR s/token / spec s/token, per row), bootstrap 95% CI; "
        "predicted = (C_T + o_ar) / (R(k) / E(k) x tail); tail = rows' tokens per round / tokens per row per batch round; fwd-only = the same without host work (o = 0); rnd ms = seconds per decode round",
        *(notes or [f"every k within {10}% of the model"]),
    ], format_table(shown, K_COLUMNS)))
    phase_rows = []
    for r in rows:
        ph = r["phases"] or {}
        unreported = r["round"] - sum(ph.values()) if ph else None
        phase_rows.append(dict(k=r["k"], **ph, unreported=unreported, round=r["round"], per_token=r["per_token"]))
    check = report["phase_check"]
    if not check["reported"]:
        check_line = "phases: not reported by the backend" + (" although it declares phase_timings" if report["declares_phase_timings"] else "")
    else:
        check_line = (f"phase check over {check['calls']} calls: reported prefill + phases vs measured wall, median gap "
                      f"{100 * check['median_gap']:+.1f}%, worst {100 * check['worst_gap']:+.1f}%; the rounds after the first vs the measured "
                      f"decode time, worst {100 * check['worst_decode_gap']:+.1f}% (tolerance {100 * check['tolerance']:.0f}% each): "
                      + ("WITHIN" if check["within"] else "OUTSIDE"))
    out.append(("Phases per decode round (backend-reported, medians)", [check_line], format_table(phase_rows, PHASE_COLUMNS)))
    pre = ", ".join(f"k={k} {_ms(v)} ms" for k, v in report["prefill_reported"].items() if v is not None)
    if report["ar"]["first"] is None:
        first_line = "not timed apart: the backend calls no on_round, so every call (AR too) is timed whole, prefill included"
    else:
        first = ", ".join(f"k={k} {_ms(v)} ms" for k, v in report["first_round"].items())
        first_line = f"AR first step (prefill + one step, measured): {1e3 * report['ar']['first']['value']:.3f} ms; spec first round (measured): {first}"
    out.append(("Prefill, timed apart", [first_line, f"prefill reported by the backend: {pre or 'not reported'}"], None))
    ctx = report.get("context")
    if ctx and ctx["rows"]:
        crow = [dict(r, shown=_interval(r["speedup"], r["low"], r["high"])) for r in ctx["rows"]]
        out.append((f"Context scaling at k={ctx['k']}", [
            f"{ctx['new_tokens']} new tokens, {ctx['repeats']} repeats per length; C_T / C_D at context + new/2, growth against the first length; "
            "KV formula 2 L n H_kv d_h b x B at context + new tokens, held = valid entries, alloc = storage the caches allocated; "
            "peak RSS = the process's peak so far (getrusage)",
            *( [f"dropped (beyond the pair's {ctx['max_positions']} positions): {ctx['dropped']}"] if ctx["dropped"] else []),
        ], format_table(crow, CONTEXT_COLUMNS)))
    mem = report["memory"]
    mismatch = report["greedy_mismatches"]
    out.append(("Memory and correctness", [
        f"peak RSS of the process (getrusage ru_maxrss; tracemalloc cannot see torch tensors): {_mib(mem['peak_rss_bytes'])} MiB; "
        f"current RSS {_mib(mem['rss_bytes'])} MiB" + ("" if mem["cuda_peak_bytes"] is None else f"; CUDA peak {_mib(mem['cuda_peak_bytes'])} MiB"),
        "greedy: " + ("-" if mismatch is None else "every speculative call equals AR token for token" if mismatch == 0
                      else f"MISMATCH: {mismatch} calls differ from AR"),
    ], None))
    return out


def text_report(report: dict, *, sections_of: Callable[[dict], list] = sections) -> str:
    """The report as plain text; ``sections_of`` lays out another report kind (e.g. :mod:`specdec_bench.profile_engine`)."""
    parts = []
    for heading, lines, table in sections_of(report):
        parts.append(f"== {heading}")
        parts.extend(lines)
        if table:
            parts.append(table)
        parts.append("")
    return "\n".join(parts).rstrip()


def markdown_report(report: dict, images: dict[str, str] | None = None, *, sections_of: Callable[[dict], list] = sections) -> str:
    parts = [f"# Speedup profile: {report['title']}", ""]
    for heading, lines, table in sections_of(report):
        parts.append(f"## {heading}")
        parts.append("")
        parts.extend(f"`{line}`" if heading == "Verdict" else f"- {line}" for line in lines)
        if table:
            parts += ["", "```", table, "```"]
        parts.append("")
    for name, path in (images or {}).items():
        parts.append(f"![{name}]({Path(path).name})")
    return "\n".join(parts).rstrip() + "\n"


def write_report(report: dict, out_dir: str | Path, *, stem: str = "profile", plots: bool = True,
                 sections_of: Callable[[dict], list] = sections) -> dict[str, str]:
    """``{stem}.json``, ``{stem}.md`` and (unless ``plots`` is False) the plots in ``out_dir``; their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    if plots:
        from .profile_plots import write_plots

        files.update(write_plots(report, out, stem))
    md = out / f"{stem}.md"
    md.write_text(markdown_report(report, files, sections_of=sections_of))
    js = out / f"{stem}.json"
    files.update(markdown=str(md), json=str(js))
    js.write_text(json.dumps(jsonable({**report, "files": files}), indent=2))
    return files
