"""One verdict table across engines, from the runner's ``verdicts.json`` files.

    python -m conformance.engines.table RUN_DIR [RUN_DIR ...] [--markdown OUT.md] [--unavailable NAME=REASON ...]

One row per (engine, patch, configuration): the engine and its version, the configuration and its declared
scheme, the verdicts of its cases (counted by level, with the smallest N and power of the certified ones), the
acceptance against its exact expectation (and, where the engine's scheme leaves acceptance on the table, what
token-wise rejection sampling would accept on the same drafts), and the findings: every case that is not certified,
with where it departs and its replay. ``--unavailable`` adds a row for an engine that cannot run here (SGLang).
Invariant: the table only reads what the runner wrote; it never re-judges a case.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

__all__ = ["rows_of", "summary_markdown", "main"]

PASSING = ("certified", "reduced")
ORDER = ("certified", "reduced", "inconclusive", "not_certified", "not_speculating", "not_reached", "lossy", "refused",
         "engine_error", "load_error", "timeout", "not_run", "tool_error")


def _verdict_cell(cases: dict) -> str:
    counts = Counter(c["level"] for c in cases.values())
    parts = [f"{counts[k]} {k.replace('_', ' ')}" for k in ORDER if counts.get(k)]
    parts += [f"{v} {k}" for k, v in counts.items() if k not in ORDER]
    ok = [c for c in cases.values() if c["level"] == "certified" and c.get("power") is not None]
    if ok:  # the certified cases' sample and stated power (reduced ones state the TV they detect instead)
        parts.append(f"certified at N >= {min(c['n'] for c in ok)}, power >= {min(c['power'] for c in ok):.2f}")
    return "; ".join(parts) or "-"


def _acceptance_cell(eff: dict | None) -> str:
    if not eff:
        return "-"
    if eff.get("acceptance_per_token") is None:
        return eff.get("verdict", "-")
    text = f"{eff['acceptance_per_token']:.3f}"
    if eff.get("expected_acceptance_per_token") is not None:
        text += f" / exact {eff['expected_acceptance_per_token']:.3f}"
    rs = eff.get("rejection_sampling_acceptance")
    if rs is not None:
        text += f" (rejection sampling: {rs:.3f})"
    if eff.get("passed") is False:
        text += " FAILS"
    elif eff.get("passed") is True:
        text += " ok"
    return text


def _findings(cfg: str, cases: dict) -> list[str]:
    out = []
    for name, c in cases.items():
        if c["level"] in PASSING and not c.get("explained") and (c.get("identity") or {}).get("passed") is not False \
                and (c.get("seeds") or {}).get("passed") is not False:
            continue
        if c["level"] in ("inconclusive", "not_run"):  # counted in the verdicts cell; not_run follows a named failure
            continue
        bits = [f"{name}: {c.get('headline', c['level'])[:140]}"]
        if c.get("departure"):
            bits.append(f"departs at {c['departure']}")
        if c.get("explained"):
            bits.append(c["explained"])
        if (c.get("identity") or {}).get("passed") is False:
            bits.append(c["identity"]["text"][:140])
        if (c.get("seeds") or {}).get("passed") is False:
            bits.append(c["seeds"]["text"][:200])
        if c.get("replay_command"):
            bits.append(f"replay: `{c['replay_command']}`")
        out.append("; ".join(bits))
    return out


def rows_of(results: dict) -> list[dict]:
    rows = []
    for cfg, r in results["configs"].items():
        rows.append({"engine": results.get("title") or results.get("engine"), "version": results.get("version"),
                     "patch": results.get("patch_key", "unpatched"), "configuration": cfg, "note": r.get("note", ""),
                     "scheme": r.get("scheme") or "-", "verdicts": _verdict_cell(r["cases"]),
                     "acceptance": _acceptance_cell(r.get("efficiency")), "failure": r.get("failure"),
                     "findings": _findings(cfg, r["cases"]) + (
                         [f"rounds: {r['rounds']['text'][:300]}"] if (r.get("rounds") or {}).get("passed") is False else [])})
    return rows


def summary_markdown(runs: list[dict], unavailable: dict[str, str] | None = None) -> str:
    lines = ["| engine | version | patch | configuration | declared scheme | verdicts (cases) | acceptance observed / exact |",
             "|---|---|---|---|---|---|---|"]
    findings = []
    for results in runs:
        for row in rows_of(results):
            lines.append(f"| {row['engine']} | {row['version']} | {row['patch']} | {row['configuration']} | "
                         f"{row['scheme']} | {row['verdicts']} | {row['acceptance']} |")
            for f in row["findings"]:
                findings.append(f"* {row['engine']} {row['version']} ({row['patch']}) / {row['configuration']} / {f}")
            if row["failure"]:
                findings.append(f"* {row['engine']} / {row['configuration']}: configuration failure: {row['failure'][:200]}")
    for name, why in (unavailable or {}).items():
        lines.append(f"| {name} | - | - | - | - | cannot run here: {why} | - |")
    if findings:
        lines += ["", "Findings (every case not certified, and every per-seed identity or tie-convention note):", ""]
        lines += findings
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.engines.table", description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="runner output folders (each holding verdicts.json)")
    ap.add_argument("--markdown", default=None, help="also write the table to this file")
    ap.add_argument("--unavailable", action="append", default=[], metavar="NAME=REASON",
                    help="a row for an engine that cannot run here")
    args = ap.parse_args(argv)
    runs, missing = [], []
    for d in args.runs:
        path = Path(d) / "verdicts.json"
        if path.is_file():
            runs.append(json.loads(path.read_text()))
        else:
            missing.append(str(path))
    unavailable = dict(u.split("=", 1) for u in args.unavailable)
    text = summary_markdown(runs, unavailable)
    if missing:
        text += "\nMissing runs (their stage failed before writing a verdict): " + ", ".join(missing) + "\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
