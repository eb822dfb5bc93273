"""One configuration of the vLLM matrix, run in its own process: load, generate, write completions and counters.

    python -m conformance.engines.vllm_worker --config NAME --raw DIR [--family F] [--patch A,B] [--cases a,b] [--split]

Run by ``conformance.engines.vllm`` (a subprocess with a timeout, so a crash or a hang of the engine never
takes the runner down). Per target family it loads ``vllm.LLM`` once (in-process engine core,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so ``--patch`` reaches the worker), runs the efficiency request set
(speculative configurations, order1) and then every case of that family in ONE ``LLM.generate`` call, the
requests of all cases interleaved (continuous batching mixes settings in every step); ``--split`` runs one
call per case instead (used after a crash, to attribute it). Writes ``DIR/<case>.jsonl`` (black-box format)
and ``DIR/worker.json`` (status per case, counters, timings), the latter after every step, so a killed worker
still leaves what it finished. Invariant: a case's file is written only when its generate call returned.
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

from .vllm_matrix import EFFICIENCY, FAMILIES, cases_for, config, speculative_config, vllm_sampling_kwargs

ENGINE_SEED = 0
ENGINE_ARGS = dict(dtype="float32", enforce_eager=True, max_model_len=32, seed=ENGINE_SEED, max_num_seqs=1024,
                   max_num_batched_tokens=8192, disable_log_stats=False)


def _env() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def spec_counters(llm) -> dict:
    """vLLM's speculative-decoding counters now (cumulative, summed over label sets)."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": None}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for m in llm.get_metrics():
        if m.name in names:
            out[names[m.name]] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            vals = [int(v) for v in m.values]
            cur = out["accepted_per_pos"] or [0] * len(vals)
            out["accepted_per_pos"] = [a + b for a, b in zip(cur, vals)]
    return out


def _delta(after: dict, before: dict) -> dict:
    d = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}
    a, b = after["accepted_per_pos"], before["accepted_per_pos"]
    d["accepted_per_pos"] = None if a is None else [x - y for x, y in zip(a, b or [0] * len(a))]
    return d


def _record(prompt, output, seed) -> dict:
    o = output.outputs[0]
    return {"prompt_ids": list(prompt), "completion_ids": [int(t) for t in o.token_ids], "seed": seed,
            "finish_reason": o.finish_reason}


def scaled(n: int, scale: float) -> int:
    return max(1, int(round(n * scale)))


def _requests(cases, eos_id: int, scale: float = 1.0):
    """(case name, prompt, seed, params) for the cases, interleaved by a fixed permutation."""
    from vllm import SamplingParams

    items = []
    for c in cases:
        for i in range(scaled(c.n, scale)):
            seed = c.seed(i)
            kw = vllm_sampling_kwargs(c.sampling, max_new_tokens=c.max_new_tokens, eos=c.eos, eos_id=eos_id, seed=seed)
            items.append((c.name, c.prompt, seed, SamplingParams(**kw)))
    random.Random(1234).shuffle(items)
    return items


def _error_text(exc: BaseException) -> str:
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return last[:400]


class Worker:
    def __init__(self, args):
        self.args, self.raw = args, Path(args.raw)
        self.raw.mkdir(parents=True, exist_ok=True)
        self.cfg = config(args.config)
        wanted = set(args.cases.split(",")) if args.cases else None
        self.cases = [c for c in cases_for(self.cfg) if (wanted is None or c.name in wanted)
                      and (not args.family or c.family == args.family)]
        self.state = {"config": self.cfg.name, "patch": args.patch or "", "applied": [], "split": bool(args.split),
                      "cases": {c.name: {"status": "pending"} for c in self.cases}, "families": {}, "efficiency": None,
                      "started": time.time()}

    def save(self) -> None:
        tmp = self.raw / "worker.json.tmp"
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.raw / "worker.json")

    def run(self) -> int:
        _env()
        try:
            if self.args.patch:
                from conformance.engines import vllm_patch

                self.state["applied"] = list(vllm_patch.apply(*self.args.patch.split(",")))
            import vllm

            self.state["vllm"] = vllm.__version__
        except Exception as exc:  # noqa: BLE001 - reported as the configuration's failure
            self.state["error"] = f"setup: {_error_text(exc)}"
            self.save()
            return 2
        self.save()
        families = [f for f in FAMILIES if any(c.family == f for c in self.cases)]
        if self.cfg.method is not None and not self.args.cases and EFFICIENCY.family not in families:
            families.insert(0, EFFICIENCY.family)
        if self.args.family:
            families = [f for f in families if f == self.args.family]
        for fam in families:
            self.family(fam)
        self.state["finished"] = time.time()
        self.save()
        return 0

    def family(self, fam: str) -> None:
        from vllm import LLM

        from specdec_ref.exact_models import exact_pair

        pair = exact_pair(FAMILIES[fam])
        info = self.state["families"].setdefault(fam, {})
        mine = [c for c in self.cases if c.family == fam]
        t0 = time.time()
        try:
            llm = LLM(model=str(pair.target.path), speculative_config=speculative_config(self.cfg, str(pair.draft.path)),
                      **ENGINE_ARGS)
        except Exception as exc:  # noqa: BLE001
            info["error"] = f"load: {_error_text(exc)}"
            for c in mine:
                self.state["cases"][c.name] = {"status": "load_error", "error": info["error"]}
            self.save()
            return
        info["load_s"] = round(time.time() - t0, 2)
        self.save()
        eos_id = int(pair.target.eos_id)
        alive = True
        if fam == EFFICIENCY.family and self.cfg.method is not None and not self.args.cases:
            alive = self.efficiency(llm, eos_id)
        if alive:
            mine, alive = self.refused(llm, mine, eos_id)
        groups = [[c] for c in sorted(mine, key=lambda c: bool(c.sampling.top_k or c.sampling.top_p))] \
            if self.args.split else ([mine] if mine else [])
        for group in groups:
            if not alive:
                for c in group:
                    self.state["cases"][c.name] = {"status": "not_run", "error": "engine failed earlier in this process"}
                continue
            alive = self.generate(llm, group, eos_id)
        del llm
        gc.collect()

    def efficiency(self, llm, eos_id: int) -> bool:
        from vllm import SamplingParams

        e = EFFICIENCY
        n = scaled(e.n, self.args.scale)
        prompts = [e.prompts[i % len(e.prompts)] for i in range(n)]
        params = [SamplingParams(**vllm_sampling_kwargs(e.sampling, max_new_tokens=e.max_new_tokens, eos=False,
                                                        eos_id=eos_id, seed=e.seed_base + i)) for i in range(n)]
        t0 = time.time()
        try:
            before = spec_counters(llm)
            outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
            counters = _delta(spec_counters(llm), before)
        except Exception as exc:  # noqa: BLE001
            self.state["efficiency"] = {"status": "engine_error", "error": _error_text(exc)}
            self.save()
            return False
        emitted = sum(len(o.outputs[0].token_ids) for o in outs)
        self.state["efficiency"] = {"status": "ok", "n": n, "prompts_last": [p[-1] for p in prompts],
                                    "emitted": emitted, "seconds": round(time.time() - t0, 2), **counters}
        self.save()
        return True

    def refused(self, llm, cases, eos_id: int):
        """Validate every case's parameters the way vLLM's input processor does at submission
        (``SamplingParams.verify``); a case the engine refuses (e.g. min_p with speculative decoding) is recorded as
        ``refused`` and left out of the batch. No request is generated (a probe request could itself crash)."""
        from vllm import SamplingParams

        ip = getattr(getattr(llm, "llm_engine", None), "input_processor", None)
        if ip is None or not hasattr(SamplingParams, "verify"):
            return cases, True
        keep = []
        for c in cases:
            params = SamplingParams(**vllm_sampling_kwargs(c.sampling, max_new_tokens=c.max_new_tokens, eos=c.eos,
                                                           eos_id=eos_id, seed=c.seed(0)))
            try:
                params.verify(ip.model_config, getattr(ip, "speculative_config", None),
                              getattr(ip, "structured_outputs_config", None), getattr(ip, "tokenizer", None))
            except Exception as exc:  # noqa: BLE001 - vLLM's validation error names the refused setting
                self.state["cases"][c.name] = {"status": "refused", "error": _error_text(exc)}
                continue
            keep.append(c)
        self.save()
        return keep, True

    def generate(self, llm, group, eos_id: int) -> bool:
        items = _requests(group, eos_id, self.args.scale)
        for c in group:
            self.state["cases"][c.name] = {"status": "running"}
        self.save()
        t0 = time.time()
        try:
            before = spec_counters(llm) if self.cfg.method else None
            outs = llm.generate([{"prompt_token_ids": list(p)} for _, p, _, _ in items], [sp for *_, sp in items],
                                use_tqdm=False)
            counters = _delta(spec_counters(llm), before) if before else None
        except Exception as exc:  # noqa: BLE001 - the engine crashed on this call
            err = _error_text(exc)
            for c in group:
                self.state["cases"][c.name] = {"status": "engine_error", "error": err,
                                               "with": [g.name for g in group]}
            self.save()
            return False
        seconds = round(time.time() - t0, 2)
        per_case: dict[str, list] = {c.name: [] for c in group}
        for (name, prompt, seed, _), out in zip(items, outs):
            per_case[name].append(_record(prompt, out, seed))
        for c in group:
            path = self.raw / f"{c.name}.jsonl"
            with open(path, "w") as fh:
                for r in per_case[c.name]:
                    fh.write(json.dumps(r) + "\n")
            self.state["cases"][c.name] = {"status": "ok", "n": len(per_case[c.name]), "file": path.name,
                                           "call_seconds": seconds, "call_requests": len(items),
                                           "call_counters": counters}
        self.save()
        return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.engines.vllm_worker", description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--raw", required=True, help="folder for this configuration's JSONL files and worker.json")
    ap.add_argument("--patch", default="", help="vllm_patch defects to apply first, e.g. A or A,B")
    ap.add_argument("--cases", default="", help="only these cases (comma-separated); no efficiency set")
    ap.add_argument("--split", action="store_true", help="one generate call per case")
    ap.add_argument("--family", default="", help="only this target family (order1 / order2): one LLM per process")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of each case's N (quick runs)")
    args = ap.parse_args(argv)
    return Worker(args).run()


if __name__ == "__main__":
    sys.exit(main())
