"""The shared kit of the benchmarks: tables, timing, the environment header and argument-list parsers.

Nothing here knows a benchmark; :mod:`specdec_bench.cli` wires the subcommands (:class:`Subcommand`) together.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

__all__ = [
    "Column",
    "Subcommand",
    "Timer",
    "choice_list",
    "columns",
    "environment",
    "fmt_float",
    "fmt_g",
    "fmt_int",
    "fmt_rate",
    "format_table",
    "int_list",
    "jsonable",
    "load_average",
    "percentile",
    "time_calls",
]


# ----------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class Column:
    """One table column: the row key, its header and how a value is printed."""

    key: str
    header: str
    fmt: Callable[[Any], str] = str


def columns(fmt: Callable[[Any], str] = str, /, **headers: str) -> list[Column]:
    """Consecutive columns printed alike: ``columns(fmt_int, batch="B", k="k")`` (row key = header)."""
    return [Column(key, header, fmt) for key, header in headers.items()]


def fmt_float(digits: int) -> Callable[[Any], str]:
    return lambda v: "-" if v is None else f"{v:.{digits}f}"


def fmt_rate(v: Any) -> str:
    """Blocks/s with an SI suffix (1.23M, 456.7k)."""
    if v is None:
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.3g}"


def fmt_g(v: Any) -> str:
    return "-" if v is None else f"{v:.3g}"


def fmt_int(v: Any) -> str:
    return "-" if v is None else f"{int(v):d}"


def format_table(rows: Sequence[dict], columns: Sequence[Column]) -> str:
    """A plain fixed-width table: text left-aligned, everything else right-aligned."""
    cells = [[c.header for c in columns]]
    for row in rows:
        cells.append(["" if row.get(c.key) is None and c.key not in row else c.fmt(row.get(c.key)) for c in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    numeric = [all(isinstance(row.get(c.key), (int, float)) or row.get(c.key) is None for row in rows) for c in columns]
    lines = []
    for n, r in enumerate(cells):
        parts = [v.rjust(w) if numeric[i] and n else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- environment, percentiles


def load_average() -> tuple[float, float, float] | None:
    """``os.getloadavg()`` rounded, or ``None`` where the platform has none."""
    try:
        return tuple(round(x, 2) for x in os.getloadavg())  # type: ignore[return-value]
    except (AttributeError, OSError):
        return None


def environment() -> dict:
    """Versions and hardware printed above every table and stored in the JSON output."""
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads_default": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) without needing numpy."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# ----------------------------------------------------------------------------- argument lists


def int_list(text: str) -> list[int]:
    """``"1,4, 8"`` -> ``[1, 4, 8]`` (an argparse ``type``)."""
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}") from exc


def choice_list(*choices: str) -> Callable[[str], list[str]]:
    """An argparse ``type``: a comma-separated, non-empty list of ``choices``."""

    def parse(text: str) -> list[str]:
        items = [x for x in text.replace(" ", "").split(",") if x]
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(choices)}, got {text!r}")
        return items

    return parse


# ----------------------------------------------------------------------------- timing


class Timer:
    """Wall seconds of ``calls`` calls; CUDA events + synchronize on CUDA."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def __call__(self, fn: Callable[[], Any], calls: int) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return time.perf_counter() - t0


def time_calls(fn: Callable[[], Any], device: str, *, repeats: int, min_seconds: float, warmup_seconds: float) -> tuple[int, list[float]]:
    """Warm up, pick calls per repeat so a repeat lasts >= min_seconds, return (calls, seconds per repeat)."""
    timer = Timer(device)
    fn()  # first call: allocator, lazy init, kernel selection
    calls, elapsed = 1, timer(fn, 1)
    while elapsed < max(warmup_seconds, 1e-3):  # warm-up doubles as calibration
        calls *= 2
        elapsed = timer(fn, calls)
    per_call = elapsed / calls
    calls = max(1, math.ceil(min_seconds / per_call)) if per_call > 0 else calls
    return calls, [timer(fn, calls) for _ in range(repeats)]


# ----------------------------------------------------------------------------- subcommands


@dataclass(frozen=True)
class Subcommand:
    """One benchmark as :mod:`specdec_bench.cli` runs it: arguments, rows, table and verdict lines.

    ``run(args)`` returns one dict per table row; :func:`specdec_bench.cli.main` adds the shared
    ``--json PATH`` output, the environment header and the table printer.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], list[dict]]
    columns: Sequence[Column] = ()
    summarise: Callable[[argparse.Namespace, list[dict]], list[str]] = lambda args, rows: []
    header: Callable[[argparse.Namespace], list[str]] = lambda args: []
    #: custom table output; default: one table of ``columns``
    print_rows: Callable[[argparse.Namespace, list[dict], Any], None] | None = None
    #: exit status from the rows (e.g. 1 when a check failed)
    exit_status: Callable[[list[dict]], int] = lambda rows: 0
    #: extra top-level entries of the JSON output, from the rows
    json_extra: Callable[[list[dict]], dict] = lambda rows: {}


def jsonable(value: Any) -> Any:
    """``value`` with non-finite floats as ``None`` and anything else unknown as ``str`` (for ``json.dump``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
