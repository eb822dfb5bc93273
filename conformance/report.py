"""The conformance certificate: JSON for machines, Markdown for the person who reads it first.

Plain functions, no pytest state: the plugin collects one entry per conformance
test item (see :func:`new_entry` / :func:`merge_phase`) and at session end calls
:func:`build_certificate`, :func:`render_markdown` and :func:`write_atomic`.

``certified`` is true only when no conformance item failed (an unexpectedly
passing strict xfail counts as failed), the session ran to completion, and at
least one item passed. Items listed in ``--specdec-xfails`` that fail as
expected (``xfailed``) do not break certification, but they are listed in the
certificate (``xfailed`` entries and the ``xfails`` section) and the Markdown
verdict says "CERTIFIED with N listed exceptions", so a certificate with
exceptions never reads like a clean one. A run in which nothing passed (every
item skipped or xfailed) certifies nothing.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Iterable

SCHEMA_VERSION = 1
STATUSES = ("passed", "failed", "skipped", "xfailed")


def new_entry(nodeid: str) -> dict[str, Any]:
    return {
        "nodeid": nodeid,
        "check_id": None,
        "status": None,
        "phase": None,  # the phase that decided a non-pass status (setup/call/teardown)
        "message": "",  # first line of the failure message
        "skip_reason": None,
        "missing_capabilities": [],
        "xfail_reason": None,
        "requires": [],
        "guards": None,
        "statistics": [],
        "findings": [],  # e.g. greedy divergences classified as numerical flips
        "duration": 0.0,
    }


def merge_phase(
    entry: dict[str, Any],
    *,
    when: str,
    outcome: str,
    props: dict[str, Any],
    duration: float,
    longrepr_message: str = "",
    wasxfail: str | None = None,
) -> None:
    """Fold one phase report (setup / call / teardown) into the item's entry."""
    entry["duration"] += float(duration or 0.0)
    if "specdec_check" in props:
        entry["check_id"] = props["specdec_check"]
    if "specdec_requires" in props:
        entry["requires"] = list(props["specdec_requires"])
    if "specdec_guards" in props:
        entry["guards"] = props["specdec_guards"]
    if "specdec_statistics" in props:
        entry["statistics"] = list(props["specdec_statistics"])
    if "specdec_findings" in props:
        entry["findings"] = list(props["specdec_findings"])
    if entry["status"] == "failed":
        return  # a failure in any phase is final
    if outcome == "failed":
        entry.update(status="failed", phase=when, message=longrepr_message)
    elif outcome == "skipped" and wasxfail is not None:
        entry.update(status="xfailed", phase=when, xfail_reason=wasxfail, message=longrepr_message)
    elif outcome == "skipped":
        entry.update(status="skipped", phase=when, skip_reason=longrepr_message)
    elif outcome == "passed" and when == "call":
        entry["status"] = "passed"


def skip_message(longrepr: Any) -> str:
    """The reason of a skip report: longrepr is ``(path, lineno, 'Skipped: reason')``."""
    if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return first_line(longrepr)


def failure_message(longrepr: Any) -> str:
    """First line of the exception message of a failure report (works on xdist-deserialized reports)."""
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return first_line(crash.message)
    text = str(longrepr or "")
    for line in text.splitlines():
        if line.startswith("E "):
            return line[2:].strip()
    return first_line(text)


def first_line(text: Any) -> str:
    for line in str(text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def build_certificate(
    entries: Iterable[dict[str, Any]],
    *,
    suite_version: str,
    backend_spec: str,
    backend: dict[str, Any] | None,
    profile: str,
    seed: int,
    exitstatus: int,
    xfails: Iterable[tuple[str, str]] = (),
    backend_error: str | None = None,
) -> dict[str, Any]:
    entries = sorted(entries, key=lambda e: e["nodeid"])
    claimed = (backend or {}).get("capabilities") or {}
    for e in entries:
        if e["status"] is None:  # no phase decided it (e.g. interrupted mid-item)
            e["status"] = "failed"
            e["message"] = e["message"] or "no outcome recorded"
        if e["status"] == "skipped" and e["requires"] and claimed:
            e["missing_capabilities"] = [flag for flag in e["requires"] if not claimed.get(flag, False)]
    totals = {s: sum(1 for e in entries if e["status"] == s) for s in STATUSES}
    totals["total"] = len(entries)
    stats = [s for e in entries for s in e["statistics"]]
    complete = exitstatus in (0, 1) and backend_error is None  # OK or TESTS_FAILED: the session ran to its end
    certified = complete and totals["failed"] == 0 and totals["passed"] > 0
    return {
        "schema_version": SCHEMA_VERSION,
        "suite_version": suite_version,
        "certified": certified,
        "complete": complete,
        "exitstatus": int(exitstatus),
        "backend_spec": backend_spec,
        "backend": backend,
        "backend_error": backend_error,
        "hypothesis_profile": profile,
        "seed": seed,
        "totals": totals,
        "statistical_tests": len(stats),
        "family_wise_alpha_bound": sum((float(s.get("alpha", 0.0)) for s in stats), 0.0),
        "xfails": [{"prefix": p, "reason": r} for p, r in xfails],
        "items": entries,
    }


def _cell(text: Any) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def render_markdown(cert: dict[str, Any]) -> str:
    t = cert["totals"]
    backend = cert.get("backend") or {}
    if cert["certified"]:
        verdict = f"**CERTIFIED**: `{cert['backend_spec']}` passed all {t['passed']} conformance checks it claims"
        if t["xfailed"]:
            verdict += f", with {t['xfailed']} listed exception(s) (xfail)"
    elif not cert["complete"]:
        verdict = f"**NOT CERTIFIED**: the session did not complete (exit status {cert['exitstatus']})"
        if cert.get("backend_error"):
            verdict += f"; backend: {cert['backend_error']}"
    elif t["failed"]:
        verdict = f"**NOT CERTIFIED**: `{cert['backend_spec']}` failed {t['failed']} conformance check(s)"
    else:
        verdict = f"**NOT CERTIFIED**: no conformance check passed for `{cert['backend_spec']}`"
    lines = [
        "# specdec conformance certificate",
        "",
        verdict,
        "",
        f"- backend: {backend.get('name', '?')} {backend.get('version', '?')} (`{cert['backend_spec']}`)",
        f"- suite version: {cert['suite_version']}, hypothesis profile: {cert['hypothesis_profile']}, base seed: {cert['seed']}",
        f"- items: {t['total']} — {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped, {t['xfailed']} xfailed",
        f"- statistical tests: {cert['statistical_tests']}, family-wise false-alarm bound (sum of alphas): "
        f"{cert['family_wise_alpha_bound']:.3g}",
    ]
    failed = [e for e in cert["items"] if e["status"] == "failed"]
    if failed:
        lines += ["", "## Failed checks", "", "| check | phase | message |", "|---|---|---|"]
        lines += [f"| `{_cell(e['check_id'] or e['nodeid'])}` | {e['phase']} | {_cell(e['message'])} |" for e in failed]
    xfailed = [e for e in cert["items"] if e["status"] == "xfailed"]
    if xfailed:
        lines += ["", "## Listed exceptions (xfailed)", "", "| check | reason |", "|---|---|"]
        lines += [f"| `{_cell(e['check_id'] or e['nodeid'])}` | {_cell(e['xfail_reason'])} |" for e in xfailed]
    skipped = [e for e in cert["items"] if e["status"] == "skipped"]
    if skipped:
        lines += ["", "## Skipped", "", "| check | reason |", "|---|---|"]
        lines += [f"| `{_cell(e['check_id'] or e['nodeid'])}` | {_cell(e['skip_reason'])} |" for e in skipped]
    stat_rows = [(e, s) for e in cert["items"] for s in e["statistics"]]
    if stat_rows:
        lines += ["", "## Statistical checks", "", "| check | status | N | power | TV | p-value | alpha |", "|---|---|---|---|---|---|---|"]
        for e, s in stat_rows:
            lines.append(
                f"| `{_cell(e['check_id'] or e['nodeid'])}` | {e['status']} | {s.get('n', '')} | {_fmt(s.get('power'))} "
                f"| {_fmt(s.get('tv'))} | {_fmt(s.get('p_value'))} | {_fmt(s.get('alpha'))} |"
            )
    flips = [(e, f) for e in cert["items"] for f in e.get("findings", []) if f.get("kind") == "numerical_flip"]
    if flips:
        lines += ["", "## Greedy divergences classified as numerical flips", "",
                  "| check | where | tokens (spec / AR) | top-1/top-2 gap | tolerance |", "|---|---|---|---|---|"]
        for e, f in flips:
            lines.append(
                f"| `{_cell(e['check_id'] or e['nodeid'])}` | {_cell(f.get('where'))} | {f.get('token_a')} / {f.get('token_b')} "
                f"| {_fmt(f.get('gap_top1_top2'))} | {_fmt(f.get('tolerance'))} |"
            )
    return "\n".join(lines) + "\n"


def _fmt(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else _cell(x)


def markdown_path(path: str) -> str:
    root, ext = os.path.splitext(path)
    md = (root if ext else path) + ".md"
    return md if md != path else path + ".md"  # never overwrite the JSON itself


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to a temp file in ``path``'s directory, then ``os.replace`` it into place."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_certificate(path: str, cert: dict[str, Any]) -> str:
    """Write the JSON certificate at ``path`` and the Markdown summary next to it; return the Markdown path."""
    md = markdown_path(path)
    write_atomic(path, json.dumps(cert, indent=2, sort_keys=False, default=str) + "\n")
    write_atomic(md, render_markdown(cert))
    return md


def parse_xfails(text: str, source: str = "xfails file") -> list[tuple[str, str]]:
    """``<test-id prefix> <reason...>`` per line; blank lines and ``#`` comments ignored.

    Raises ``ValueError`` naming the line number of a line without a reason.
    """
    entries = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) < 2 or not parts[1].strip():
            raise ValueError(f"{source}:{lineno}: expected '<test-id prefix> <reason>', got {raw!r}")
        entries.append((parts[0], parts[1].strip()))
    return entries
