"""Pictures for a certificate: what a failed statistical test saw, and a lossy scheme's measured distances.

For every failed statistical test in a certificate (the full look or the interim look that rejected), one PNG:

* a chi-square test of counts (its record carries ``cells``: the cells deviating most): observed against expected
  counts per cell, and below them each cell's standardised residual ``(observed - expected) / sqrt(expected)``,
  impossible outcomes (expected 0, observed > 0) marked;
* a test of a total against its exact expectation (``observed``, ``expected``, ``std``): the expectation with its
  two-sided acceptance region at the test's alpha, and the observed total.

For a backend that declares a lossy scheme, one PNG of every measured total variation with its interval.

matplotlib is an optional extra (``pip install -e ".[plots]"``): without it the certificate is complete and says
that its pictures were not drawn. Files go in one folder next to the Markdown; the Markdown links them relatively.
"""
from __future__ import annotations

import os
import re
from typing import Any

from specdec_properties.stats import is_test

#: The folder beside ``cert.md`` that holds its pictures: ``cert-plots/``.
PLOTS_SUFFIX = "-plots"


def plots_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def failed_tests(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The failed hypothesis tests of a certificate entry, full look first, then the interim look's."""
    stats = list(entry.get("statistics") or []) + list(entry.get("interim_statistics") or [])
    return [s for s in stats if is_test(s) and s.get("passed") is False]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:80] or "check"


def draw_certificate(cert: dict[str, Any], directory: str) -> dict[str, Any]:
    """Draw the certificate's pictures into ``directory``; returns ``{"tests": {check: [file, ...]}, "lossy": file or
    None}`` with file names relative to ``directory``'s parent (as the Markdown beside it links them).

    Raises ``ImportError`` (naming the extra) when matplotlib is missing and there is something to draw."""
    drawn: dict[str, Any] = {"tests": {}, "lossy": None}
    todo = [(e, failed_tests(e)) for e in cert["items"] if e.get("status") == "failed"]
    todo = [(e, tests) for e, tests in todo if tests]
    lossy = [(e, s) for e in cert["items"] for s in e.get("statistics") or [] if not is_test(s)]
    if not todo and not lossy:
        return drawn
    plt = _pyplot()
    os.makedirs(directory, exist_ok=True)
    base = os.path.basename(os.path.normpath(directory))
    for entry, tests in todo:
        name = entry.get("check_id") or entry.get("nodeid") or "check"
        files = []
        for i, test in enumerate(tests):
            fig = _cells_figure(plt, test) if test.get("cells") else _total_figure(plt, test) if "std" in test else None
            if fig is None:
                continue
            file = f"{_slug(name)}-{i}.png"
            fig.savefig(os.path.join(directory, file), dpi=110, bbox_inches="tight")
            plt.close(fig)
            files.append(f"{base}/{file}")
        if files:
            drawn["tests"][name] = files
    if lossy:
        fig = _lossy_figure(plt, lossy)
        fig.savefig(os.path.join(directory, "lossy-distances.png"), dpi=110, bbox_inches="tight")
        plt.close(fig)
        drawn["lossy"] = f"{base}/lossy-distances.png"
    return drawn


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("the certificate's plots need matplotlib: pip install -e \".[plots]\"") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _wrap(text: str, width: int = 90) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if len(line) + len(w) + 1 > width and line:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    return "\n".join(lines + [line])


def _cells_figure(plt, test: dict[str, Any]):
    """Observed vs expected counts per cell (the cells deviating most) and their standardised residuals."""
    cells = test["cells"]
    labels = [str(c[0]) for c in cells]
    observed = [c[1] for c in cells]
    expected = [c[2] for c in cells]
    residual = [c[3] for c in cells]
    x = range(len(cells))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6.0, 0.38 * len(cells) + 2), 6.2), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    top.bar([i - 0.2 for i in x], observed, width=0.4, label="observed", color="#c0392b")
    top.bar([i + 0.2 for i in x], expected, width=0.4, label="expected (exact law)", color="#7f8c8d")
    top.set_ylabel("count")
    top.legend(loc="upper right", fontsize=8)
    top.set_title(_wrap(f"{test['what']}: chi-square {test['statistic']:.1f} on {test['df']} df, p={test['p_value']:.3g} "
                        f"(alpha {test['alpha']:g}), N={test['n']}"), fontsize=8)
    finite = [r if r is not None else 0.0 for r in residual]
    colors = ["#c0392b" if r is None else ("#e67e22" if abs(r) >= 3 else "#95a5a6") for r in residual]
    bottom.bar(list(x), finite, color=colors)
    for i, r in enumerate(residual):
        if r is None:
            bottom.annotate("impossible", (i, 0), rotation=90, fontsize=7, ha="center", va="bottom", color="#c0392b")
    for level in (-3, 3):
        bottom.axhline(level, color="#34495e", linewidth=0.6, linestyle="--")
    bottom.axhline(0, color="black", linewidth=0.6)
    bottom.set_ylabel("(obs - exp) / sqrt(exp)")
    bottom.set_xticks(list(x))
    bottom.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    fig.tight_layout()
    return fig


def _total_figure(plt, test: dict[str, Any]):
    """The exact expectation of a total with its acceptance region at the test's alpha, and the observed total."""
    from scipy import stats

    crit = float(stats.norm.isf(test["alpha"] / 2))
    expected, std, observed = test["expected"], test["std"], test["observed"]
    fig, ax = plt.subplots(figsize=(6.0, 2.6))
    ax.errorbar([expected], [0], xerr=[[crit * std], [crit * std]], fmt="o", color="#7f8c8d", capsize=6,
                label=f"exact expectation, acceptance region at alpha {test['alpha']:g}")
    ax.plot([observed], [0], "D", color="#c0392b", label=f"observed (z = {test['statistic']:.2f})")
    ax.set_yticks([])
    ax.set_ylim(-1, 1.6)
    ax.set_xlabel(test.get("unit", "total"))
    ax.legend(loc="upper center", fontsize=8, ncol=1, framealpha=0.9)
    ax.set_title(_wrap(f"{test['what']}: N={test['n']}, p={test['p_value']:.3g}"), fontsize=8)
    fig.tight_layout()
    return fig


def _lossy_figure(plt, measured: list[tuple[dict[str, Any], dict[str, Any]]]):
    """Every measured TV of a lossy scheme with its interval, one row per measurement."""
    fig, ax = plt.subplots(figsize=(7.0, 0.45 * len(measured) + 1.4))
    for i, (entry, s) in enumerate(measured):
        ax.errorbar([s["estimate"]], [i], xerr=[[s["estimate"] - s["lo"]], [s["hi"] - s["estimate"]]], fmt="o",
                    color="#2c3e50", capsize=4)
    ax.set_yticks(range(len(measured)))
    ax.set_yticklabels([str(e.get("check_id") or e.get("nodeid")) for e, _ in measured], fontsize=7)
    ax.set_xlabel(f"total variation from the exact law ({measured[0][1].get('confidence', 0.99):.0%} intervals)")
    ax.set_xlim(left=0)
    fig.tight_layout()
    return fig
