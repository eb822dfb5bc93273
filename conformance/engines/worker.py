"""One configuration of an engine's matrix on one target family, in its own process: load, generate, write.

    python -m conformance.engines.worker ENGINE --config NAME --raw DIR --family F [--patch A,B] [--cases a,b] [--split]

Run by :mod:`conformance.engines.runner` (a subprocess with a timeout, in its own process group, so a crash or a
hang of the engine, or of a server it started, never takes the runner down). It loads the engine once through the
adapter (:meth:`EngineAdapter.open`), runs the efficiency request set (speculative configurations, order1 family),
drops the cases the engine refuses at submission, then generates every case of the family in ONE batch (the
requests of all cases interleaved by a fixed permutation: continuous batching mixes settings in every step);
``--split`` runs one batch per case instead (used after a crash, to attribute it). Writes ``DIR/<case>.jsonl``
(black-box format, plus the engine's per-request counters where it reports them), ``DIR/efficiency.jsonl`` (the
efficiency set's completions: argmax-draft rounds are rebuilt from them) and ``DIR/worker.json`` (status
per case, counters, timings) after every step, so a killed worker still leaves what it finished. Invariant: a
case's file is written only when its batch returned, and its records are in request order with their seeds.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path

from .adapter import Request, adapter as get_adapter
from .matrix import EFFICIENCY

COUNTER_KEYS = ("drafts", "draft_tokens", "accepted")


def delta(after: dict | None, before: dict | None) -> dict | None:
    """Counters accumulated between two readings (None when the engine reports none)."""
    if after is None:
        return None
    before = before or {}
    d = {k: int(after.get(k) or 0) - int(before.get(k) or 0) for k in COUNTER_KEYS}
    a, b = after.get("accepted_per_pos"), before.get("accepted_per_pos")
    d["accepted_per_pos"] = None if a is None else [x - y for x, y in zip(a, b or [0] * len(a))]
    return d


def scaled(n: int, scale: float) -> int:
    return max(1, int(round(n * scale)))


def case_requests(cases, eos_id: int, scale: float = 1.0) -> list[Request]:
    """Every request of the cases, interleaved by a fixed permutation."""
    items = [Request(c.name, c.prompt, c.sampling, c.max_new_tokens, c.eos, eos_id, c.seed(i))
             for c in cases for i in range(scaled(c.n, scale))]
    random.Random(1234).shuffle(items)
    return items


def efficiency_requests(eos_id: int, scale: float = 1.0) -> list[Request]:
    e = EFFICIENCY
    n = scaled(e.n, scale)
    return [Request("efficiency", e.prompts[i % len(e.prompts)], e.sampling, e.max_new_tokens, False, eos_id,
                    e.seed_base + i) for i in range(n)]


def error_text(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()[:400]


class Worker:
    def __init__(self, args):
        self.args, self.raw = args, Path(args.raw)
        self.raw.mkdir(parents=True, exist_ok=True)
        self.adapter = get_adapter(args.engine)
        self.cfg = self.adapter.config(args.config)
        wanted = set(args.cases.split(",")) if args.cases else None
        self.cases = [c for c in self.adapter.cases_for(self.cfg) if (wanted is None or c.name in wanted)
                      and c.family == args.family]
        # the law each case is sampled under is the one the engine declares (its top-k tie rule)
        from dataclasses import replace

        conv = self.adapter.conventions
        self.cases = [replace(c, sampling=conv.sampling(c.sampling)) for c in self.cases]
        self.state = {"engine": self.adapter.name, "config": self.cfg.name, "family": args.family,
                      "patch": args.patch or "", "applied": [], "split": bool(args.split),
                      "cases": {c.name: {"status": "pending"} for c in self.cases}, "families": {}, "efficiency": None,
                      "started": time.time()}

    def save(self) -> None:
        tmp = self.raw / "worker.json.tmp"
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.raw / "worker.json")

    def run(self) -> int:
        try:
            patches = [p for p in self.args.patch.split(",") if p]
            self.state["applied"] = list(self.adapter.apply_patches(patches))
            self.state["version"] = self.adapter.installed_version()
        except Exception as exc:  # noqa: BLE001 - reported as the configuration's failure
            self.state["error"] = f"setup: {error_text(exc)}"
            self.save()
            return 2
        self.save()
        self.family(self.args.family)
        self.state["finished"] = time.time()
        self.save()
        return 0

    def family(self, fam: str) -> None:
        from specdec_ref.exact_models import exact_pair

        pair = exact_pair(self.adapter.families[fam])
        info = self.state["families"].setdefault(fam, {})
        t0 = time.time()
        try:
            session = self.adapter.open(self.cfg, fam)
        except Exception as exc:  # noqa: BLE001
            info["error"] = f"load: {error_text(exc)}"
            for c in self.cases:
                self.state["cases"][c.name] = {"status": "load_error", "error": info["error"]}
            self.save()
            return
        info["load_s"] = round(time.time() - t0, 2)
        self.save()
        eos_id = int(pair.target.eos_id)
        try:
            alive = True
            if fam == EFFICIENCY.family and self.cfg.speculative and not self.args.cases:
                alive = self.efficiency(session, eos_id)
            mine = self.refused(session, self.cases, eos_id) if alive else self.cases
            groups = [[c] for c in sorted(mine, key=lambda c: bool(c.sampling.top_k or c.sampling.top_p))] \
                if self.args.split else ([mine] if mine else [])
            for group in groups:
                if not alive:
                    for c in group:
                        self.state["cases"][c.name] = {"status": "not_run",
                                                       "error": "engine failed earlier in this process"}
                    continue
                alive = self.generate(session, group, eos_id)
        finally:
            try:
                session.close()
            except Exception as exc:  # noqa: BLE001 - a failing close is recorded, never raised over the results
                info["close_error"] = error_text(exc)
            del session
            gc.collect()
            self.save()

    def efficiency(self, session, eos_id: int) -> bool:
        reqs = efficiency_requests(eos_id, self.args.scale)
        t0 = time.time()
        try:
            before = session.counters()
            outs = session.generate(reqs)
            counters = delta(session.counters(), before)
        except Exception as exc:  # noqa: BLE001
            self.state["efficiency"] = {"status": "engine_error", "error": error_text(exc)}
            self.save()
            return False
        emitted = sum(len(o["completion_ids"]) for o in outs)
        per_request = _per_request_sums(outs)
        path = self.raw / "efficiency.jsonl"  # the completions: the runner rebuilds argmax-draft rounds from them
        with open(path, "w") as fh:
            fh.writelines(json.dumps({"prompt_ids": list(req.prompt), "seed": req.seed,
                                      "completion_ids": [int(t) for t in out["completion_ids"]],
                                      **{k: v for k, v in out.items() if k != "completion_ids"}}) + "\n"
                          for req, out in zip(reqs, outs))
        self.state["efficiency"] = {"status": "ok", "n": len(reqs), "prompts_last": [r.prompt[-1] for r in reqs],
                                    "emitted": emitted, "seconds": round(time.time() - t0, 2), "file": str(path),
                                    **(counters or per_request or {"drafts": 0, "draft_tokens": 0, "accepted": 0,
                                                                  "accepted_per_pos": None}),
                                    "counters_source": "engine" if counters else
                                    ("per-request" if per_request else "none")}
        self.save()
        return True

    def refused(self, session, cases, eos_id: int):
        """Cases whose settings the engine refuses at submission (its own validation) are recorded as ``refused``
        and left out of the batch. No request is generated for the probe (a probe could itself crash)."""
        keep = []
        for c in cases:
            why = None
            try:
                why = session.refuses(Request(c.name, c.prompt, c.sampling, c.max_new_tokens, c.eos, eos_id, c.seed(0)))
            except Exception as exc:  # noqa: BLE001 - the validation itself raised: that is its refusal
                why = error_text(exc)
            if why:
                self.state["cases"][c.name] = {"status": "refused", "error": why}
                continue
            keep.append(c)
        self.save()
        return keep

    def generate(self, session, group, eos_id: int) -> bool:
        items = case_requests(group, eos_id, self.args.scale * self.cfg.scale)
        for c in group:
            self.state["cases"][c.name] = {"status": "running"}
        self.save()
        t0 = time.time()
        try:
            before = session.counters() if self.cfg.speculative else None
            outs = session.generate(items)
            counters = delta(session.counters(), before) if self.cfg.speculative else None
            if len(outs) != len(items):
                raise RuntimeError(f"the engine returned {len(outs)} completions for {len(items)} requests")
        except Exception as exc:  # noqa: BLE001 - the engine crashed on this batch
            err = error_text(exc)
            for c in group:
                self.state["cases"][c.name] = {"status": "engine_error", "error": err, "with": [g.name for g in group]}
            self.save()
            return False
        seconds = round(time.time() - t0, 2)
        per_case: dict[str, list] = {c.name: [] for c in group}
        for req, out in zip(items, outs):
            per_case[req.case].append({"prompt_ids": list(req.prompt), "completion_ids": [int(t) for t in out["completion_ids"]],
                                       "seed": req.seed, **{k: v for k, v in out.items() if k != "completion_ids"}})
        for c in group:
            path = self.raw / f"{c.name}.jsonl"
            with open(path, "w") as fh:
                for r in per_case[c.name]:
                    fh.write(json.dumps(r) + "\n")
            self.state["cases"][c.name] = {"status": "ok", "n": len(per_case[c.name]), "file": path.name,
                                           "call_seconds": seconds, "call_requests": len(items),
                                           "call_counters": counters,
                                           "case_counters": _per_request_sums(per_case[c.name])}
        self.save()
        if self.adapter.seed_probe and self.adapter.conventions.seeds == "per_request":
            self.seed_probe(session, group, items, outs)
        return True

    def seed_probe(self, session, group, items, outs) -> None:
        """The per-request seed probe (:mod:`conformance.engines.seeds`), after the batch and its counters."""
        from .seeds import compare, probe_requests

        batch, picked = probe_requests(items)
        if not batch:
            return
        try:
            again = session.generate(batch)
        except Exception as exc:  # noqa: BLE001 - the probe's own batch crashed: recorded on the cases
            for c in group:
                self.state["cases"][c.name]["seed_probe"] = {"error": error_text(exc)}
            self.save()
            return
        for c in group:
            record = compare(c.name, items, outs, again[: len(picked)], picked)
            if record is not None:
                self.state["cases"][c.name]["seed_probe"] = record
        self.save()


def _per_request_sums(records) -> dict | None:
    """Totals of the per-request counters (``draft_tokens``, ``accepted``) where the engine reports them."""
    if not records or any("draft_tokens" not in r for r in records):
        return None
    return {"drafts": sum(1 for r in records if r.get("draft_tokens")),
            "draft_tokens": sum(int(r["draft_tokens"]) for r in records),
            "accepted": sum(int(r.get("accepted") or 0) for r in records),
            "accepted_per_pos": None,
            "requests_without_drafts": sum(1 for r in records if not r.get("draft_tokens")
                                           and len(r["completion_ids"]) > 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.engines.worker", description=__doc__.split("\n")[0])
    ap.add_argument("engine")
    ap.add_argument("--config", required=True)
    ap.add_argument("--raw", required=True, help="folder for this configuration's JSONL files and worker.json")
    ap.add_argument("--family", required=True, help="target family (order1 / order2): one engine load per process")
    ap.add_argument("--patch", default="", help="the adapter's patches to apply first, e.g. A or A,B")
    ap.add_argument("--cases", default="", help="only these cases (comma-separated); no efficiency set")
    ap.add_argument("--split", action="store_true", help="one batch per case")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of each case's N (quick runs)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return Worker(args).run()


if __name__ == "__main__":
    sys.exit(main())
