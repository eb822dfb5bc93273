"""One configuration of an engine's matrix on one target family, in its own process: load, generate, write.

    python -m conformance.engines.worker ENGINE --config NAME --raw DIR --family F [--patch A,B] [--cases a,b] [--split]
                                         [--control R,W]

Run by :mod:`conformance.engines.runner` (a subprocess with a timeout, in its own process group, so a crash or a
hang of the engine, or of a server it started, never takes the runner down). It loads the engine once through the
adapter (:meth:`EngineAdapter.open`), runs the efficiency request set (speculative configurations, order1 family)
and drops the cases the engine refuses at submission. Then it generates the cases in *waves*: each wave holds the
next requests of every case still running, in ONE batch (interleaved by a fixed permutation: continuous batching
mixes settings in every step), except a case that follows another (``Case.after``: a conversation's next turn), sent
in a batch after it; ``--split`` runs one batch per case instead (used after a crash, to attribute it).
With ``--control R,W`` (two file descriptors the runner passes) the runner says what each wave holds, ``{"wave":
{case: lines}}`` (request indices continue across waves, so seeds do), and the worker answers each with
``{"event": "wave_done", ...}`` after its first message ``{"event": "ready", ...}``; ``{"stop": true}`` or the
pipe's end closes the engine. Without it, one wave generates every case in full. Writes ``DIR/<case>.jsonl``
(black-box format, plus the engine's per-request counters where it reports them; each wave appended in request
order), ``DIR/efficiency.jsonl`` (the efficiency set's completions: argmax-draft rounds are rebuilt from them) and
``DIR/worker.json`` (status per case, counters, timings) after every step, so a killed worker still leaves what it
finished. Invariant: a wave's lines are written only when its batch returned, each line with its request's seed;
the per-request seed probe runs after a case's first wave.
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
from .conditions import COUNTERS, condition, under
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


def request_lines(req, out: dict) -> list[dict]:
    """A request's lines in the case file: one per completion (``"index"`` on each where it asked for ``n > 1``)."""
    if req.n > 1:
        samples = out.get("samples")
        if not isinstance(samples, list) or len(samples) != req.n:
            raise RuntimeError(f"a request asking for n={req.n} completions got "
                               f"{'none' if samples is None else len(samples)} in its record's 'samples'")
        return [{"prompt_ids": list(req.prompt), "completion_ids": [int(t) for t in s["completion_ids"]],
                 "seed": req.seed, "index": int(s.get("index", j)),
                 **{k: v for k, v in s.items() if k not in ("completion_ids", "index")}} for j, s in enumerate(samples)]
    return [{"prompt_ids": list(req.prompt), "completion_ids": [int(t) for t in out["completion_ids"]],
             "seed": req.seed, **{k: v for k, v in out.items() if k != "completion_ids"}}]


def scaled(n: int, scale: float) -> int:
    return max(1, int(round(n * scale)))


def case_requests(cases, eos_id: int, ranges: dict[str, tuple[int, int]], wave: int = 0) -> tuple[list[Request], list[int]]:
    """``(requests, their indices)``: requests ``start .. stop - 1`` of every case (``ranges[case.name]``; a request's
    index fixes its seed), interleaved by a permutation fixed by the wave's number."""
    items = [(Request(c.name, c.prompt_of(i), c.sampling, c.max_new_tokens, c.eos, eos_id, c.seed(i), c.logprobs,
                      c.samples, c.stops, c.stream), i)
             for c in cases for i in range(*ranges[c.name])]
    random.Random(1234 + wave).shuffle(items)
    return [r for r, _ in items], [i for _, i in items]


def batches(running, *, split: bool = False) -> list[list]:
    """The batches one wave generates, in order: every running case in one batch, except the cases that follow
    another (``Case.after``: the next turn of a conversation), in a batch after it; ``split``: one batch per case,
    the top-k / top-p cases last."""
    names = {c.name for c in running}
    first = [c for c in running if c.after not in names]
    later = [c for c in running if c.after in names]
    if split:
        return [[c] for c in sorted(first, key=lambda c: bool(c.sampling.top_k or c.sampling.top_p))] + [[c] for c in later]
    return [g for g in (first, later) if g]


class ControlChannel:
    """The worker's end of the runner's pipes: one JSON object per line each way."""

    def __init__(self, fds: str):
        r, w = (int(x) for x in fds.split(","))
        self.rx, self.tx = os.fdopen(r, "r", encoding="utf-8"), os.fdopen(w, "w", encoding="utf-8")

    def send(self, message: dict) -> None:
        self.tx.write(json.dumps(message) + "\n")
        self.tx.flush()

    def receive(self) -> dict | None:
        line = self.rx.readline()
        return json.loads(line) if line.strip() else None


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
                      and c.group == args.family]
        self.family_name, _, cond = args.family.partition("@")
        if cond:  # as this configuration runs it (its condition_settings applied)
            self.condition = under(condition(cond), self.cfg.condition_settings)
        else:
            self.condition = None
        # the law each case is sampled under is the one the engine declares (its top-k tie rule, its text)
        self.cases = [self.adapter.conventions.under(c) for c in self.cases]
        self.lines: dict[str, list[dict]] = {}  # every line written per case, across waves
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
        self.family(self.family_name)
        self.state["finished"] = time.time()
        self.save()
        return 0

    def family(self, fam: str) -> None:
        from specdec_ref.exact import exact_pair

        pair = exact_pair(self.adapter.families[fam])
        info = self.state["families"].setdefault(self.args.family, {})  # the worker's group (family@condition)
        t0 = time.time()
        try:
            session = self.adapter.open(self.cfg, fam) if self.condition is None else \
                self.adapter.open_condition(self.cfg, fam, self.condition)
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
            if fam == EFFICIENCY.family and self.cfg.speculative and self.cfg.efficiency and not self.args.cases \
                    and self.condition is None:
                alive = self.efficiency(session, eos_id)
            mine = self.refused(session, self.cases, eos_id) if alive else self.cases
            if alive:
                self.waves(session, mine, eos_id)
            else:
                for c in mine:
                    self.state["cases"][c.name] = {"status": "not_run", "error": "engine failed earlier in this process"}
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
                why = session.refuses(case_requests([c], eos_id, {c.name: (0, 1)})[0][0])  # as the batch asks it
            except Exception as exc:  # noqa: BLE001 - the validation itself raised: that is its refusal
                why = error_text(exc)
            if why:
                self.state["cases"][c.name] = {"status": "refused", "error": why}
                continue
            keep.append(c)
        self.save()
        return keep

    def waves(self, session, cases, eos_id: int) -> None:
        """Generate the cases wave by wave: as the runner says over the control channel, else one wave in full."""
        full = {c.name: scaled(c.n, self.args.scale * self.cfg.scale) for c in cases}
        have = {c.name: 0 for c in cases}
        channel = ControlChannel(self.args.control) if self.args.control else None
        if channel is not None:
            channel.send({"event": "ready", "cases": self._statuses(), "lines": full})
        alive, wave = True, 0
        while alive:
            if channel is None:
                if wave:
                    break
                targets = full
            else:
                message = channel.receive()
                if not message or message.get("stop"):
                    break
                targets = {name: int(n) for name, n in message["wave"].items() if name in full}  # the runner's looks
            running = [c for c in cases if targets.get(c.name, 0) > have[c.name]]
            groups = batches(running, split=self.args.split)
            for group in groups:
                if not alive:
                    for c in group:
                        self.state["cases"][c.name] = {"status": "not_run",
                                                       "error": "engine failed earlier in this process"}
                    continue
                # lines -> requests: a case with n > 1 completions per request writes n lines per request
                stop = {c.name: -(-targets[c.name] // c.samples) for c in group}
                alive = self.generate(session, group, {c.name: (have[c.name] // c.samples, stop[c.name]) for c in group},
                                      eos_id, wave)
                if alive:
                    have.update({c.name: stop[c.name] * c.samples for c in group})
            wave += 1
            self.save()
            if channel is not None:
                channel.send({"event": "wave_done", "wave": wave, "alive": alive, "cases": self._statuses()})
        if not alive:  # cases never asked for after the engine failed
            for c in cases:
                if self.state["cases"][c.name].get("status") == "pending":
                    self.state["cases"][c.name] = {"status": "not_run", "error": "engine failed earlier in this process"}
            self.save()

    def _statuses(self) -> dict:
        return {name: {k: c.get(k) for k in ("status", "n", "error")} for name, c in self.state["cases"].items()}

    def generate(self, session, group, ranges: dict[str, tuple[int, int]], eos_id: int, wave: int = 0) -> bool:
        """One batch: requests ``ranges[case]`` of every case in ``group``, appended to the cases' files."""
        items, indices = case_requests(group, eos_id, ranges, wave)
        for c in group:
            self.state["cases"][c.name] = {**self.state["cases"][c.name], "status": "running"}
        self.save()
        t0 = time.time()
        try:
            before = session.counters() if self.cfg.speculative else None
            seen = self.evidence_now(session)
            outs = session.generate(items)
            counters = delta(session.counters(), before) if self.cfg.speculative else None
            evidence = evidence_delta(self.evidence_now(session), seen)
            if len(outs) != len(items):
                raise RuntimeError(f"the engine returned {len(outs)} completions for {len(items)} requests")
            per_case: dict[str, list] = {c.name: [] for c in group}
            for req, i, out in sorted(zip(items, indices, outs), key=lambda x: (x[0].case, x[1])):  # request order
                per_case[req.case].extend(request_lines(req, out))  # raises on a wrong number of n > 1 completions
        except Exception as exc:  # noqa: BLE001 - the engine crashed on this batch, or answered it malformed
            err = error_text(exc)
            for c in group:
                self.state["cases"][c.name] = {"status": "engine_error", "error": err, "with": [g.name for g in group],
                                               "wave": wave}
            self.save()
            return False
        seconds = round(time.time() - t0, 2)
        for c in group:
            path = self.raw / f"{c.name}.jsonl"
            first = ranges[c.name][0] == 0
            with open(path, "w" if first else "a") as fh:
                for r in per_case[c.name]:
                    fh.write(json.dumps(r) + "\n")
            lines = self.lines.setdefault(c.name, [])
            if first:
                lines.clear()
            lines.extend(per_case[c.name])
            old = self.state["cases"][c.name] if not first else {}
            self.state["cases"][c.name] = {
                "status": "ok", "n": len(lines), "file": path.name,
                "call_seconds": round((old.get("call_seconds") or 0) + seconds, 2),
                "call_requests": (old.get("call_requests") or 0) + len(items),
                "call_counters": _added(old.get("call_counters"), counters),
                "case_counters": _per_request_sums(lines),
                "waves": (old.get("waves") or []) + [[len(lines), seconds]],
                **({"evidence": evidence_added(old.get("evidence"), evidence)} if evidence is not None else {}),
                **({"seed_probe": old["seed_probe"]} if "seed_probe" in old else {})}
        self.save()
        if self.adapter.seed_probe and self.adapter.conventions.seeds == "per_request":
            new = [c for c in group if ranges[c.name][0] == 0]  # a case's probe runs after its first wave
            names = {c.name for c in new}
            mine = [(r, o) for r, o in zip(items, outs) if r.case in names]
            if mine:
                self.seed_probe(session, new, [r for r, _ in mine], [o for _, o in mine])
        return True

    def evidence_now(self, session) -> dict | None:
        """What the engine reports now of a condition's evidence (None outside a condition, or when it reports none)."""
        if self.condition is None or not hasattr(session, "condition_counters"):
            return None
        try:
            return session.condition_counters()
        except Exception as exc:  # noqa: BLE001 - recorded: the condition is then not shown reached
            return {"error": error_text(exc)}

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


def evidence_delta(after: dict | None, before: dict | None) -> dict | None:
    """A condition's evidence over one batch: counters ``after - before``, settings and readings as ``after``."""
    if after is None:
        return None
    before = before or {}
    return {k: int(v) - int(before.get(k) or 0) if k in COUNTERS and v is not None else v for k, v in after.items()}


def evidence_added(total: dict | None, more: dict | None) -> dict | None:
    """A case's evidence over its batches: counters summed, settings and readings the latest."""
    if more is None:
        return total
    out = dict(total or {})
    for k, v in more.items():
        out[k] = int(out.get(k) or 0) + int(v) if k in COUNTERS and v is not None else v
    return out


def _added(total: dict | None, more: dict | None) -> dict | None:
    """Counters of two batches added (None when the engine reports none)."""
    if more is None:
        return total
    if total is None:
        return dict(more)
    out = {k: int(total.get(k) or 0) + int(more.get(k) or 0) for k in COUNTER_KEYS}
    a, b = total.get("accepted_per_pos"), more.get("accepted_per_pos")
    out["accepted_per_pos"] = None if a is None or b is None else [x + y for x, y in zip(a, b)]
    return out


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
    ap.add_argument("--family", required=True, help="target family (order1 / order2), or family@condition for a "
                    "serving condition's cases (conformance.engines.conditions): one engine load per process")
    ap.add_argument("--patch", default="", help="the adapter's patches to apply first, e.g. A or A,B")
    ap.add_argument("--cases", default="", help="only these cases (comma-separated); no efficiency set")
    ap.add_argument("--split", action="store_true", help="one batch per case")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of each case's N (quick runs)")
    ap.add_argument("--control", default="", help="R,W: file descriptors of the runner's pipes (waves as it says)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return Worker(args).run()


if __name__ == "__main__":
    sys.exit(main())
