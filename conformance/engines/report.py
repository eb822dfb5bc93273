"""Pure parts of the engine runner: outcome levels, the expectation file, the verdict table.

No engine import. Invariant: :func:`check_expected` fails exactly when an observed level is outside the
recorded set for its (patch, configuration, case) or when the tooling itself errored; an outcome recorded
as nondeterministic (several levels) passes with any of them.
"""
from __future__ import annotations

import json
from pathlib import Path

from .verdict import Level

__all__ = [
    "TOOL_ERROR", "patch_key", "expectation_entries", "check_expected", "merge_expected",
    "markdown", "write_json",
]

#: Our own tooling failed on the case (never an expected outcome): :attr:`conformance.engines.verdict.Level.TOOL_ERROR`.
TOOL_ERROR = Level.TOOL_ERROR.value


def patch_key(patch: str) -> str:
    """``""`` -> ``"unpatched"``; ``"b,a"`` -> ``"patch A,B"``."""
    names = sorted({p.strip().upper() for p in patch.split(",") if p.strip()})
    return "patch " + ",".join(names) if names else "unpatched"


def expectation_entries(results: dict) -> dict:
    """``{config: {case: level}}`` (plus ``efficiency``, ``rounds`` where a configuration declares its argmax proposer
    and ``rounds:<case>`` for each serving condition's case it ran,
    and ``identity:<case>`` where it claims per-seed identity; ``seeds:<case>`` where the per-request seed probe failed
    on a case whose law passed: a passing probe adds no entry, so expectations recorded before the probe stay valid,
    and a case whose law failed adds none either, so its entry does not depend on whether a nondeterministic failure
    crashed before the probe) from a run's ``verdicts.json`` data."""
    out = {}
    for cfg, r in results["configs"].items():
        row = {case: c["level"] for case, c in r["cases"].items()}
        eff = r.get("efficiency") or {}
        if eff.get("passed") is not None:
            row["efficiency"] = "pass" if eff["passed"] else "fail"
        if (r.get("rounds") or {}).get("passed") is not None:
            row["rounds"] = "pass" if r["rounds"]["passed"] else "fail"
        for case, c in r["cases"].items():
            if (c.get("identity") or {}).get("passed") is not None:
                row[f"identity:{case}"] = "pass" if c["identity"]["passed"] else "fail"
            if (c.get("seeds") or {}).get("passed") is False and c["level"] in ("certified", "reduced"):
                row[f"seeds:{case}"] = "fail"
            if (c.get("rounds") or {}).get("passed") is not None:
                row[f"rounds:{case}"] = "pass" if c["rounds"]["passed"] else "fail"
        out[cfg] = row
    return out


def merge_expected(expected: dict, key: str, observed: dict, *, version: str, engine: str) -> dict:
    """Record ``observed`` under ``key``: levels seen in earlier recordings are kept, so an outcome seen with two
    levels becomes a list (nondeterministic)."""
    expected = json.loads(json.dumps(expected or {}))
    expected.setdefault("engine", engine)
    expected.setdefault("version", version)
    section = expected.setdefault("expected", {}).setdefault(key, {})
    for cfg, row in observed.items():
        dst = section.setdefault(cfg, {})
        for case, level in row.items():
            old = dst.get(case)
            seen = set(old if isinstance(old, list) else ([old] if old else []))
            seen.add(level)
            dst[case] = sorted(seen) if len(seen) > 1 else level
    return expected


def check_expected(expected: dict, key: str, observed: dict) -> list[str]:
    """Mismatches (empty: as recorded). Tool errors are always mismatches; a case missing from the record is one."""
    problems = []
    section = (expected or {}).get("expected", {}).get(key)
    if section is None:
        return [f"no expectation recorded for {key}"]
    for cfg, row in observed.items():
        for case, level in row.items():
            if level == TOOL_ERROR:
                problems.append(f"{cfg} / {case}: our tooling errored")
                continue
            want = section.get(cfg, {}).get(case)
            allowed = want if isinstance(want, list) else ([want] if want else [])
            if level not in allowed:
                problems.append(f"{cfg} / {case}: got {level}, recorded {want if want else 'nothing'}")
    return problems


def _fmt(x, spec=".3g"):
    return "-" if x is None else format(x, spec)


def markdown(results: dict) -> str:
    """The verdict table and the efficiency table of one run."""
    conv = results.get("conventions") or {}
    lines = [f"# {results.get('title', results.get('engine', '?'))} {results.get('version', '?')} black-box verdicts "
             f"({results['patch_key']})", "",
             f"command: `{results['command']}`; wall {results['wall_s']:.0f} s", ""]
    if conv:
        lines += [f"declared conventions: top-k ties `{conv.get('top_k_ties')}`, seeds `{conv.get('seeds')}`, first token "
                  f"{'at prefill' if conv.get('first_token_at_prefill') else 'from the first round'}"
                  + "".join(f"; {n}" for n in conv.get("notes") or []), ""]
    lines += ["N: the completions the verdict read (the look that decided it: interim, early pass or full; the planned "
              "full look in brackets); power: the whole procedure's, every look together", "",
              "| configuration | case | prompt | settings | N (look, of planned) | power / detects TV >= | verdict | "
              "first departure | acceptance observed / exact |", "|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for cfg, r in results["configs"].items():
        eff = r.get("efficiency") or {}
        acc = "-"
        if eff.get("acceptance_per_token") is not None:
            acc = f"{eff['acceptance_per_token']:.3f}"
            if eff.get("expected_acceptance_per_token") is not None:
                acc += f" / {eff['expected_acceptance_per_token']:.3f}"
        for case, c in r["cases"].items():
            power = "-" if c.get("power") is None else f"{c['power']:.3f} / {_fmt(c.get('detects'))}"
            verdict = c.get("headline") or c["level"]
            for what in ("explained", "identity", "seeds", "speculation", "condition", "rounds", "logprobs", "samples",
                         "twin", "text"):
                x = c.get(what)
                if what == "text" and x and x.get("text") == c.get("explained"):
                    continue  # already the explanation line
                if x and not (what in ("speculation", "seeds") and x.get("passed")):  # a pass is no news; a condition's
                    # evidence and its rounds are news either way (what the engine reported)
                    notes.append(f"* {cfg} / {case}, {what}: {x if isinstance(x, str) else x.get('text')}")
            looks = c.get("looks") or {}
            n = f"{c.get('n', '-')}" + (f" ({looks['look'].replace('_', ' ')}, of {looks['full_n']})" if looks.get("look") else "")
            lines.append(f"| {cfg} | {case} | {c.get('prompt', '')} | {c.get('settings', '')} | {n} | "
                         f"{power} | {verdict} | {c.get('departure') or '-'} | {acc} |")
    if notes:
        lines += ["", "## Per case: tie conventions, per-seed identity, seeds, speculation, conditions' evidence, "
                  "log-probabilities, texts", ""] + notes
    if any(r.get("efficiency") for r in results["configs"].values()):
        lines += ["", "## Efficiency (the engine's counters vs the exact expectation of the configured scheme)", "",
                  "| configuration | scheme | drafts (exact E) | per position: observed / exact (z) | verdict |",
                  "|---|---|---|---|---|"]
    for cfg, r in results["configs"].items():
        eff = r.get("efficiency")
        if not eff:
            continue
        pos = "; ".join(
            f"{p['position']}: {p['observed']:.4f}" + (f" / {p['expected']:.4f} ({p['z']:+.1f})" if "expected" in p else "")
            for p in eff.get("positions", []))
        lines.append(f"| {cfg} | {eff.get('scheme') or '-'} | {eff.get('drafts', '-')} ({_fmt(eff.get('expected_drafts'), '.0f')}) | "
                     f"{pos or '-'} | {eff.get('verdict', '-')} |")
    rounds = [(cfg, r["rounds"]) for cfg, r in results["configs"].items() if r.get("rounds")]
    if rounds:
        lines += ["", "## Rounds (argmax drafts: the counters vs the rounds rebuilt from the efficiency set's completions)",
                  "", "| configuration | proposer | verdict |", "|---|---|---|"]
        lines += [f"| {cfg} | {x.get('proposer', '-')} | {'PASS' if x.get('passed') else 'FAIL' if x.get('passed') is False else '-'}: "
                  f"{x.get('text', '')[:600]} |" for cfg, x in rounds]
    failures = [(cfg, r["failure"]) for cfg, r in results["configs"].items() if r.get("failure")]
    if failures:
        lines += ["", "## Configuration failures", ""] + [f"* {cfg}: {f}" for cfg, f in failures]
    return "\n".join(lines) + "\n"


def write_json(path: Path, data) -> None:
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
