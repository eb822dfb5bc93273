"""Pictures of a profile (matplotlib, the optional extra ``plots``): speedup against k with intervals, speedup
against context length, and stacked phase bars per k. Everything else in a profile works without matplotlib;
:func:`write_plots` raises :class:`PlotsUnavailable` with the install command when it is missing."""
from __future__ import annotations

from pathlib import Path

__all__ = ["PlotsUnavailable", "write_plots"]

_PHASE_COLOURS = {"draft": "#4c72b0", "verify": "#dd8452", "repair": "#55a868", "other": "#8172b3", "unreported": "#bbbbbb"}


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotsUnavailable(
            f"plots need matplotlib, which is not installed ({exc}); install the extra: pip install -e '.[plots]' "
            "(or pass --no-plots)"
        ) from None
    return plt


def _speedup_vs_k(plt, report: dict, path: Path) -> None:
    rows = report["model"]["rows"]
    ks = [r["k"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.errorbar(ks, [r["measured"] for r in rows], yerr=[[r["measured"] - r["low"] for r in rows], [r["high"] - r["measured"] for r in rows]],
                fmt="o-", capsize=4, label="measured (median, 95% CI)")
    ax.plot(ks, [r["predicted"] for r in rows], "s--", label="cost model")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel("k (drafts per round)")
    ax.set_ylabel("speedup over AR")
    ax.set_xticks(ks)
    _finish(plt, fig, ax, report, path)


def _finish(plt, fig, ax, report: dict, path: Path) -> None:
    """Title, legend, layout; write ``path`` and free the figure."""
    ax.set_title(report["title"], fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _speedup_vs_context(plt, report: dict, path: Path) -> None:
    rows = report["context"]["rows"]
    xs = [r["context"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.errorbar(xs, [r["speedup"] for r in rows], yerr=[[r["speedup"] - r["low"] for r in rows], [r["high"] - r["speedup"] for r in rows]],
                fmt="o-", capsize=4, label=f"k={report['context']['k']} (median, 95% CI)")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.minorticks_off()
    ax.set_xlabel("context length (prompt tokens)")
    ax.set_ylabel("speedup over AR")
    _finish(plt, fig, ax, report, path)


def _phase_bars(plt, report: dict, path: Path) -> None:
    """Seconds per token by phase for AR and every k, in AR-token units (AR = 1); each phase's forward share (k C_D,
    C_V(k), f_k C_D from the measured costs) solid, the rest of the phase (host work) hatched."""
    rows = report["model"]["rows"]
    ar = report["model"]["fit"]["ar_per_token"]
    costs = report["costs"]
    labels = ["AR"] + [f"k={r['k']}" for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.bar([0], [costs["C_T"] / ar], color="#c44e52", label="AR target forward")
    ax.bar([0], [1.0 - costs["C_T"] / ar], bottom=[costs["C_T"] / ar], color="#c44e52", hatch="///", alpha=0.5)
    bottoms = [0.0] * len(rows)

    def stack(heights, **style):
        nonlocal bottoms
        ax.bar(range(1, len(rows) + 1), heights, bottom=bottoms, **style)
        bottoms = [b + h for b, h in zip(bottoms, heights)]

    for phase in ("draft", "verify", "repair", "other", "unreported"):
        forward, host = [], []
        for r in rows:
            ph = r.get("phases") or {}
            if phase == "unreported":
                value = r["round"] - sum(ph.get(p, 0.0) for p in ("draft", "verify", "repair", "other")) if ph else r["round"]
            else:
                value = ph.get(phase, 0.0)
            model = {"draft": r["k"] * costs["C_D"], "verify": costs["C_V"][str(r["k"])], "repair": r["full"] * costs["C_D"]}.get(phase, 0.0)
            model = min(model, max(value, 0.0)) if ph else 0.0
            scale = 1.0 / r["tokens_per_round"] / ar * r.get("tail", 1.0)
            forward.append(model * scale)
            host.append((max(value, 0.0) - model) * scale)
        colour = _PHASE_COLOURS[phase]
        stack(forward, color=colour, label=phase if phase != "unreported" else "not reported")
        stack(host, color=colour, hatch="///", alpha=0.5)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    ax.set_ylabel("seconds per token / AR's")
    ax.set_title(report["title"], fontsize=9)
    ax.set_ylim(0, max([1.0] + bottoms) * 1.35)
    from matplotlib.patches import Patch

    handles, names = ax.get_legend_handles_labels()
    handles.append(Patch(facecolor="white", edgecolor="grey", hatch="///"))
    names.append("host work (hatched)")
    ax.legend(handles, names, fontsize=7, ncol=3, loc="upper center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(report: dict, out_dir: str | Path, stem: str = "profile") -> dict[str, str]:
    """Write ``{stem}-speedup-k.png``, ``{stem}-phases.png`` and (with a context sweep) ``{stem}-context.png``."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"speedup_vs_k": out / f"{stem}-speedup-k.png", "phases": out / f"{stem}-phases.png"}
    _speedup_vs_k(plt, report, paths["speedup_vs_k"])
    _phase_bars(plt, report, paths["phases"])
    if (report.get("context") or {}).get("rows"):
        paths["speedup_vs_context"] = out / f"{stem}-context.png"
        _speedup_vs_context(plt, report, paths["speedup_vs_context"])
    return {k: str(v) for k, v in paths.items()}
