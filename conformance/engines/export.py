"""``python -m conformance.engines export ENGINE [--no-check]``: the exactly-known checkpoints in the engine's format,
and what the engine computes from them against the tables.

One command for every engine: it runs :meth:`conformance.engines.adapter.EngineAdapter.export` in the engine's own
interpreter (:meth:`~conformance.engines.adapter.EngineAdapter.python`: its venv), prints one line per model and
variant, and exits 0 when every row passed, 1 when one did not, 2 when the engine is not installed. Writing is
cached (only what is missing or stale is written again).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from .adapter import EngineMissingError, adapter as get_adapter

__all__ = ["main"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.engines export", description=__doc__.splitlines()[0])
    ap.add_argument("engine", help="a registered engine, or package.module:ATTRIBUTE")
    ap.add_argument("--no-check", action="store_true", help="write the files only")
    args = ap.parse_args(argv)
    try:
        ad = get_adapter(args.engine)
        python = ad.python()
    except (EngineMissingError, KeyError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    if os.path.abspath(python) != os.path.abspath(sys.executable):  # the engine's own interpreter (a venv: its own path)
        cmd = [python, "-m", "conformance.engines", "export", args.engine] + (["--no-check"] if args.no_check else [])
        return subprocess.run(cmd).returncode
    rows = ad.export(check=not args.no_check)
    for r in rows:
        print(("ok      " if r["passed"] else "DIFFERS ") + r["text"])
    if not rows:
        print(f"{ad.title}: nothing to write or check (the engine loads the shipped folders as they are)")
    return 0 if all(r["passed"] for r in rows) else 1
