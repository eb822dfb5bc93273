"""The certificate and the verdict: one function decides, every output (terminal, JSON, Markdown) prints it.

Plain functions, no pytest state. Entries are dicts, one per check case: the plugin
builds them from the items' phase reports (:func:`new_entry` / :func:`merge_phase`),
``run_checks`` users from records (:func:`certificate_for_records`); both go
through :func:`build_certificate`, which computes the verdict once.

The verdict has three levels, worded the same everywhere (``cert["verdict"]["headline"]``):

* ``CERTIFIED`` -- every claimed check passed, every statistical test at the power it states
  (:data:`specdec_properties.stats.TARGET_POWER` against its alternative);
* ``CERTIFIED AT REDUCED POWER: detects TV >= x`` -- every claimed check passed, but some
  statistical tests had fewer samples (e.g. a backend that is not batched, or the ``dev``
  profile); ``x`` is the largest TV such a test needs to detect a deviation with that power,
  and the checks that set it are named;
* ``NOT CERTIFIED`` -- a check failed, raised (``error``), was ``inconclusive`` (too few
  samples to detect even TV :data:`specdec_properties.stats.INCONCLUSIVE_TV`), the session did not
  complete, or nothing passed;
* ``LOSSY: TV x [lo, hi]`` -- a backend that declares the ``lossy`` scheme and breaks no check: the
  measured total variation between its text law and the target's, with its 99% interval, and the
  tokens it emits per verify call against exact token-wise verification. Never "certified".

Listed known failures (``--specdec-xfails``) that fail as expected are ``xfailed``: they do
not break certification but are named ("with N listed exception(s)"). Errors are grouped by
exception type and message, with the first traceback kept once. The family-wise false-alarm
bound is the sum of the per-test alphas (Bonferroni), computed here only.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Iterable

from specdec_properties.early_pass import EARLY_PASS_BETA
from specdec_properties.stats import is_test

SCHEMA_VERSION = 2
STATUSES = ("passed", "failed", "error", "inconclusive", "skipped", "xfailed")
CERTIFIED = "CERTIFIED"
REDUCED = "CERTIFIED AT REDUCED POWER"
NOT_CERTIFIED = "NOT CERTIFIED"
LOSSY = "LOSSY"
#: How many checks the reduced-power headline names.
NAMED_LIMITS = 3
#: Token ids a report prints of a sequence before it abbreviates it (:func:`show_ids`).
SHOWN_IDS = 16


def show_ids(ids) -> str:
    """A token-id sequence as a report line prints it: whole up to :data:`SHOWN_IDS` ids, otherwise its first and
    last eight with the length between (``[6, 2, .. 2034 more .., 1] (2050 ids)``): a long-context prompt stays one readable
    line; the replay command names the file, which holds every id."""
    ids = [int(t) for t in ids]
    if len(ids) <= SHOWN_IDS:
        return str(ids)
    half = SHOWN_IDS // 2
    head, tail = ", ".join(map(str, ids[:half])), ", ".join(map(str, ids[-half:]))
    return f"[{head}, .. {len(ids) - SHOWN_IDS} more .., {tail}] ({len(ids)} ids)"


def new_entry(nodeid: str | None, check_id: str | None = None) -> dict[str, Any]:
    return {
        "nodeid": nodeid,
        "check_id": check_id,
        "check": None,
        "status": None,
        "phase": None,  # the phase that decided a non-pass status (setup/call/teardown)
        "message": "",
        "skip_reason": None,
        "missing_capabilities": [],
        "xfail_reason": None,
        "requires": [],
        "guards": None,
        "statistics": [],
        "findings": [],  # e.g. greedy divergences classified as numerical flips
        "interim_statistics": [],  # tests of the interim look (their alpha is in the family-wise bound)
        "power": None,  # full | reduced | inconclusive for a statistical check that ran
        "error_type": None,
        "error": None,  # "Type: message" of the exception itself: what errors are grouped by
        "error_source": None,  # "backend" (raised by a backend call) or "check"
        "traceback": None,
        "duration": 0.0,
    }


_RECORD_FIELDS = ("check", "message", "guards", "requires", "missing_capabilities", "statistics", "findings",
                  "power", "error_type", "error", "error_source", "traceback", "interim_statistics")
#: Statuses a phase has already decided: a later phase does not change them.
_DECIDED = ("failed", "error", "inconclusive", "xfailed", "skipped")


def entry_from_record(record: dict[str, Any], nodeid: str | None = None) -> dict[str, Any]:
    """A certificate entry from a :meth:`conformance.registry.CheckRecord.as_entry` dict (no pytest)."""
    entry = new_entry(nodeid, record["check_id"])
    entry.update({k: record[k] for k in _RECORD_FIELDS}, status=record["status"], duration=record["duration"])
    if record["status"] != "passed":
        entry["phase"] = "call"
    if record["status"] == "skipped":
        entry["skip_reason"] = record["message"]
    return entry


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
    """Fold one pytest phase report (setup / call / teardown) into the item's entry.

    The call phase carries the core's record (``specdec_record``, see the plugin's adapter): its
    status wins, except where pytest knows better (an expected failure is ``xfailed``, a strict
    xfail that passed is ``failed``, a failing fixture is an ``error``). A non-pass outcome of an
    earlier phase is final.
    """
    entry["duration"] += float(duration or 0.0)
    if "specdec_requires" in props and not entry["requires"]:
        entry["requires"] = list(props["specdec_requires"])
    record = props.get("specdec_record") if when == "call" else None
    if record is not None:
        entry.update({k: record[k] for k in _RECORD_FIELDS})
    if entry["status"] in _DECIDED:
        return
    if outcome == "failed":
        if record is not None and record["status"] in ("failed", "error", "inconclusive"):
            entry.update(status=record["status"], phase=when)
        else:  # a failing fixture, or a strict xfail that passed
            entry.update(status="failed" if when == "call" else "error", phase=when, message=longrepr_message)
    elif outcome == "skipped" and wasxfail is not None:
        entry.update(status="xfailed", phase=when, xfail_reason=wasxfail, message=longrepr_message or entry["message"])
    elif outcome == "skipped":
        reason = record["message"] if record is not None else longrepr_message
        entry.update(status="skipped", phase=when, skip_reason=reason)
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


# ----------------------------------------------------------------------------- the verdict


def _entry_detects(entry: dict[str, Any]) -> float:
    values = [s.get("detects") for s in entry["statistics"]]
    return max((v for v in values if v is not None), default=0.0)


def group_errors(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Errors grouped by the exception (type and message), largest group first."""
    groups: dict[tuple, dict[str, Any]] = {}
    for e in entries:
        if e["status"] != "error":
            continue
        key = (e.get("error_type") or "error", first_line(e.get("error") or e["message"]), e.get("error_source"))
        group = groups.setdefault(
            key, {"error_type": key[0], "message": key[1], "source": key[2], "count": 0, "checks": [],
                  "traceback": e.get("traceback")},
        )
        group["count"] += 1
        group["checks"].append(e["check_id"] or e["nodeid"])
        group["traceback"] = group["traceback"] or e.get("traceback")
    return sorted(groups.values(), key=lambda g: -g["count"])


def _exact_tokens(stat: dict[str, Any]) -> float | None:
    """Tokens per call of the exact scheme a lossy one is compared with (token-wise for chains)."""
    return stat.get("exact_tokens_per_round", stat.get("token_wise_tokens_per_round"))


def declares_lossy(capabilities: dict[str, Any]) -> bool:
    """A backend declaring a lossy chain scheme, or claiming tree verification with a lossy tree scheme."""
    return capabilities.get("scheme") == "lossy" or bool(capabilities.get("tree") and capabilities.get("tree_scheme") == "lossy")


def _lossy_verdict(entries: list[dict[str, Any]], spec: str, skipped: str) -> tuple[str, str, str]:
    """A backend declared lossy that broke no contract: the measured distance is the verdict."""
    measured = [s for e in entries if e["status"] == "passed" for s in e["statistics"] if not is_test(s)]
    detail = f"`{spec}` declares a lossy scheme and passed every check it claims; {skipped}"
    if not measured:
        return LOSSY, f"{LOSSY}: distance from the target's law not measured", detail
    worst = max(measured, key=lambda s: s["hi"])
    headline = f"{LOSSY}: TV {worst['estimate']:.3g} [{worst['lo']:.3g}, {worst['hi']:.3g}]"
    detail += f"; {worst['what']}: total variation {worst['estimate']:.4f}, {worst['confidence']:.0%} interval [{worst['lo']:.4f}, {worst['hi']:.4f}] (N={worst['n']})"
    if "gain" in worst:
        detail += (
            f"; {worst['tokens_per_round']:.3f} tokens per verify call vs {_exact_tokens(worst):.3f} "
            f"for exact {worst.get('exact_scheme', 'token-wise')} verification from the same states (x{worst['gain']:.3f})"
        )
    return LOSSY, headline, detail


def decide_verdict(entries: list[dict[str, Any]], totals: dict[str, int], *, spec: str, complete: bool,
                   exitstatus: int | None, backend_error: str | None, scheme: str = "token") -> dict[str, Any]:
    """The verdict: level, headline (the same words in every output) and the sentence after it.

    A backend declaring the ``lossy`` scheme that breaks no check gets ``LOSSY: TV x [lo, hi]``: the
    measured distance of its text law from the target's, with its 99% interval (never "certified")."""
    skipped = f"{totals['skipped']} skipped (unclaimed capabilities or cases that do not apply)"
    if totals["xfailed"]:
        skipped += f", with {totals['xfailed']} listed exception(s) (xfail)"
    limits: list[dict[str, Any]] = []
    if not complete:
        level, headline = NOT_CERTIFIED, f"{NOT_CERTIFIED}: the session did not complete"
        detail = f"exit status {exitstatus}" + (f"; backend: {backend_error}" if backend_error else "")
    elif totals["failed"] or totals["error"] or totals["inconclusive"]:
        parts = [f"{totals[s]} {s}" for s in ("failed", "error", "inconclusive") if totals[s]]
        level, headline = NOT_CERTIFIED, f"{NOT_CERTIFIED}: {', '.join(parts)}"
        detail = f"`{spec}` did not pass {totals['failed'] + totals['error'] + totals['inconclusive']} conformance check(s) it claims"
    elif totals["passed"] == 0:
        level, headline = NOT_CERTIFIED, f"{NOT_CERTIFIED}: no conformance check passed"
        detail = f"`{spec}`: {skipped}"
    elif scheme == "lossy":
        level, headline, detail = _lossy_verdict(entries, spec, skipped)
    else:
        reduced = [e for e in entries if e["status"] == "passed" and e.get("power") == "reduced"]
        detail = f"`{spec}` passed all {totals['passed']} conformance checks it claims; {skipped}"
        if reduced:
            ranked = sorted(reduced, key=_entry_detects, reverse=True)
            x = _entry_detects(ranked[0])
            limits = [{"check_id": e["check_id"], "detects": _entry_detects(e)} for e in ranked]
            named = ", ".join(f"{lim['check_id']} ({lim['detects']:.3g})" for lim in limits[:NAMED_LIMITS])
            more = f" and {len(limits) - NAMED_LIMITS} more" if len(limits) > NAMED_LIMITS else ""
            level, headline = REDUCED, f"{REDUCED}: detects TV >= {x:.3g}"
            detail += f"; too few samples for full power in {len(limits)} check(s), the weakest: {named}{more}"
        else:
            level, headline = CERTIFIED, CERTIFIED
            stats = any(e["statistics"] for e in entries if e["status"] == "passed")
            detail += "; every statistical test at its stated power" if stats else "; none of them statistical"
    return {"level": level, "headline": headline, "detail": detail, "reduced_power": limits}


def build_certificate(
    entries: Iterable[dict[str, Any]],
    *,
    suite_version: str,
    backend_spec: str,
    backend: dict[str, Any] | None,
    profile: str,
    seed: int,
    exitstatus: int | None,
    xfails: Iterable[tuple[str, str]] = (),
    backend_error: str | None = None,
) -> dict[str, Any]:
    """The certificate: every entry, totals, grouped errors, the family-wise bound and the verdict.

    ``exitstatus`` is pytest's (0 or 1 mean the session ran to its end), or None outside pytest.
    """
    entries = sorted(entries, key=lambda e: (e["check_id"] or "", e["nodeid"] or ""))
    claimed = (backend or {}).get("capabilities") or {}
    for e in entries:
        if e["status"] is None:  # no phase decided it (e.g. interrupted mid-item)
            e["status"] = "error"
            e["message"] = e["message"] or "no outcome recorded"
        if e["status"] == "skipped" and e["requires"] and claimed and not e["missing_capabilities"]:
            e["missing_capabilities"] = [flag for flag in e["requires"] if not claimed.get(flag, False)]
    totals = {s: sum(1 for e in entries if e["status"] == s) for s in STATUSES}
    totals["total"] = len(entries)
    stats = [s for e in entries for s in e["statistics"] if is_test(s)]
    # an interim look spends alpha too: the family-wise bound adds it
    interim = [s for e in entries for s in e.get("interim_statistics") or [] if is_test(s)]
    complete = (exitstatus is None or exitstatus in (0, 1)) and backend_error is None
    verdict = decide_verdict(entries, totals, spec=backend_spec, complete=complete, exitstatus=exitstatus,
                             backend_error=backend_error, scheme="lossy" if declares_lossy(claimed) else claimed.get("scheme", "token"))
    return {
        "schema_version": SCHEMA_VERSION,
        "suite_version": suite_version,
        "certified": verdict["level"] in (CERTIFIED, REDUCED),
        "verdict": verdict,
        "complete": complete,
        "exitstatus": exitstatus,
        "backend_spec": backend_spec,
        "backend": backend,
        "backend_error": backend_error,
        "hypothesis_profile": profile,
        "seed": seed,
        "totals": totals,
        "statistical_tests": len(stats),
        "interim_tests": len(interim),
        "early_passes": sum(1 for e in entries if any(s.get("early_pass") for s in e["statistics"])),
        "family_wise_alpha_bound": sum((float(s.get("alpha", 0.0)) for s in stats + interim), 0.0),
        "errors": group_errors(entries),
        "xfails": [{"line": p, "reason": r} for p, r in xfails],
        "items": entries,
    }


def certificate_for_records(records, *, backend, backend_spec: str = "", profile: str = "ci", seed: int | None = None) -> dict:
    """The certificate of :func:`conformance.run_checks` records (no pytest): the same verdict as the plugin's."""
    import specdec_ref

    from .profiles import DEFAULT_SEED

    return build_certificate(
        [entry_from_record(r.as_entry()) for r in records],
        suite_version=specdec_ref.__version__,
        backend_spec=backend_spec or getattr(backend, "name", "?"),
        backend=backend_info(backend),
        profile=profile,
        seed=DEFAULT_SEED if seed is None else seed,
        exitstatus=None,
    )


def backend_info(backend) -> dict[str, Any]:
    return {
        "name": getattr(backend, "name", None),
        "version": getattr(backend, "version", None),
        "capabilities": backend.capabilities.as_dict(),
    }


def statistics_line(cert: dict[str, Any]) -> str:
    if not cert["statistical_tests"]:
        if cert.get("interim_tests"):
            return (f"{cert['interim_tests']} statistical tests at their interim look only: family-wise false-alarm "
                    f"probability <= {cert['family_wise_alpha_bound']:.2g} (Bonferroni)")
        return "no statistical tests ran"
    alphas = [s.get("alpha", 0.0) for e in cert["items"] for s in e["statistics"] if is_test(s)]
    interim = cert.get("interim_tests") or 0
    looks = f" (plus {interim} interim looks at 1/100 of that alpha)" if interim else ""
    early = cert.get("early_passes") or 0
    passed_early = (f"; {early} checks passed at an early-pass look (on part of their sample, every statistic below the "
                    f"bound a deviation at the stated alternative exceeds there; the looks together let such a deviation "
                    f"pass with probability <= {EARLY_PASS_BETA:g}, and the stated power is net of that)"
                    if early else "")
    return (
        f"{cert['statistical_tests']} statistical tests at per-test alpha <= {max(alphas):g}{looks}: family-wise "
        f"false-alarm probability <= {cert['family_wise_alpha_bound']:.2g} (Bonferroni: the sum of the per-test alphas)"
        + passed_early
    )


def verdict_lines(cert: dict[str, Any], *, tracebacks: bool = True) -> list[str]:
    """The verdict as the terminal prints it (the Markdown header uses the same headline and detail)."""
    v = cert["verdict"]
    lines = [statistics_line(cert), f"{v['headline']}: {v['detail']}"]
    for status in ("failed", "inconclusive"):
        for e in (e for e in cert["items"] if e["status"] == status):
            lines.append(f"  {status.upper()} {e['check_id'] or e['nodeid']}: {first_line(e['message'])}")
    for group in cert["errors"]:
        names = ", ".join(group["checks"][:6]) + (f" and {group['count'] - 6} more" if group["count"] > 6 else "")
        who = "the check itself raised" if group.get("source") == "check" else "the backend raised"
        lines.append(f"  ERROR in {group['count']} check(s), {who} {group['message']}: {names}")
        if tracebacks and group.get("traceback"):
            lines.append("  first traceback:")
            lines += ["    " + line for line in group["traceback"].rstrip().splitlines()]
    return lines


# ----------------------------------------------------------------------------- Markdown


def _cell(text: Any) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def _fmt(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else _cell(x)


def _name(e: dict[str, Any]) -> str:
    return f"`{_cell(e['check_id'] or e['nodeid'])}`"


def _table(title: str, header: tuple[str, ...], rows: list[tuple]) -> list[str]:
    """A Markdown section with one table, or nothing when there are no rows."""
    if not rows:
        return []
    lines = ["", f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def render_markdown(cert: dict[str, Any], plots: dict[str, Any] | None = None) -> str:
    """The certificate as Markdown; ``plots`` (:func:`conformance.report_plots.draw_certificate`'s result, or
    ``{"missing": why}``) adds a section of pictures of the failed tests and the lossy distances."""
    t = cert["totals"]
    backend = cert.get("backend") or {}
    v = cert["verdict"]
    lines = [
        "# specdec conformance certificate",
        "",
        f"**{v['headline']}**: {v['detail']}",
        "",
        f"- backend: {backend.get('name', '?')} {backend.get('version', '?')} (`{cert['backend_spec']}`)",
        f"- suite version: {cert['suite_version']}, hypothesis profile: {cert['hypothesis_profile']}, base seed: {cert['seed']}",
        f"- items: {t['total']} — " + ", ".join(f"{t[s]} {s}" for s in STATUSES),
        f"- {statistics_line(cert)}",
    ]
    items = cert["items"]
    lines += _table("Checks at reduced power", ("check", "detects TV >="),
                    [(f"`{_cell(lim['check_id'])}`", _fmt(lim["detects"])) for lim in v["reduced_power"]])
    for status, title in (("failed", "Failed checks"), ("inconclusive", "Inconclusive checks (too few samples)")):
        lines += _table(title, ("check", "phase", "message"),
                        [(_name(e), e["phase"], _cell(first_line(e["message"]))) for e in items if e["status"] == status])
    if cert["errors"]:
        lines += ["", "## Errors (the backend raised), grouped", ""]
        for group in cert["errors"]:
            lines += [f"**{_cell(group['message'])}** in {group['count']} check(s): "
                      + ", ".join(f"`{c}`" for c in group["checks"]), ""]
            if group.get("traceback"):
                lines += ["```", group["traceback"].rstrip(), "```", ""]
    lines += _table("Listed exceptions (xfailed)", ("check", "reason"),
                    [(_name(e), _cell(e["xfail_reason"])) for e in items if e["status"] == "xfailed"])
    lines += _table("Skipped", ("check", "reason"), [(_name(e), _cell(e["skip_reason"])) for e in items if e["status"] == "skipped"])
    lines += _table(
        "Statistical checks", ("check", "status", "N", "power", "TV", "detects TV >=", "p-value", "alpha"),
        [(_name(e), e["status"], s.get("n", ""), *(_fmt(s.get(key)) for key in ("power", "tv", "detects", "p_value", "alpha")))
         for e in items for s in e["statistics"] if is_test(s)],
    )
    lines += _table(
        "Measured distances (lossy scheme)", ("check", "N", "TV", "99% interval", "tokens per call", "exact scheme", "its tokens per call", "gain"),
        [(_name(e), s["n"], _fmt(s["estimate"]), f"[{_fmt(s['lo'])}, {_fmt(s['hi'])}]", _fmt(s.get("tokens_per_round")),
          s.get("exact_scheme", "token-wise"), _fmt(_exact_tokens(s)), _fmt(s.get("gain")))
         for e in items for s in e["statistics"] if not is_test(s)],
    )
    lines += _table(
        "Greedy divergences classified as numerical flips", ("check", "where", "tokens (spec / AR)", "top-1/top-2 gap", "tolerance"),
        [(_name(e), _cell(f.get("where")), f"{f.get('token_a')} / {f.get('token_b')}", _fmt(f.get("gap_top1_top2")), _fmt(f.get("tolerance")))
         for e in items for f in e.get("findings", []) if f.get("kind") == "numerical_flip"],
    )
    lines += _plot_section(plots)
    return "\n".join(lines) + "\n"


def _plot_section(plots: dict[str, Any] | None) -> list[str]:
    if not plots:
        return []
    if plots.get("missing"):
        return ["", "## Plots", "", f"Not drawn: {plots['missing']}"]
    lines = []
    for check, files in plots.get("tests", {}).items():
        lines += [f"**`{_cell(check)}`**: observed against the exact law", ""] + [f"![{_cell(check)}]({f})" for f in files] + [""]
    if plots.get("lossy"):
        lines += ["**Measured distances of the lossy scheme**", "", f"![measured distances]({plots['lossy']})", ""]
    return ["", "## Plots", "", *lines] if lines else []


# ----------------------------------------------------------------------------- files


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
    """Write the JSON certificate at ``path`` and the Markdown summary next to it, with a folder of pictures of the
    failed statistical tests (``cert-plots/``, :mod:`conformance.report_plots`; matplotlib optional); return the
    Markdown path."""
    from .report_plots import PLOTS_SUFFIX, draw_certificate

    md = markdown_path(path)
    write_atomic(path, json.dumps(cert, indent=2, sort_keys=False, default=str, allow_nan=False) + "\n")
    try:
        plots = draw_certificate(cert, os.path.splitext(md)[0] + PLOTS_SUFFIX)
    except ImportError as exc:
        plots = {"missing": str(exc)}
    write_atomic(md, render_markdown(cert, plots))
    return md
