"""Does vLLM's own speculation pay on this machine? :mod:`specdec_bench.profile_engine`'s profile, with vLLM as the engine.

    .venv-vllm/bin/python -m specdec_bench.vllm_profile --out DIR [--pair wide-exact|exact:NAME] [--k 1,2,4]
                                                              [--ngram-k 3] [--mode greedy|sampling] [--patch A] ...
    specdec-bench profile-engine --engine vllm --out DIR ...   (the same from any interpreter: run under .venv-vllm)

Design (the pairing and the timing are :mod:`specdec_bench.profile_engine`'s): every variant -- no speculation,
``draft_model`` at each k, optionally ``ngram`` -- is its own ``vllm.LLM``, all loaded once in THIS process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: in-process engine core, ``uni`` executor; an idle instance runs nothing),
and the variants' ``generate`` calls are interleaved on the same token-id prompts with the same request seeds,
each call timed by the tool. Acceptance: vLLM's per-request speculative metrics
(``per_request_spec_decode_metrics="summary"``: per request, a histogram of the drafts accepted per round).
``LLM.get_metrics()`` (:func:`conformance.engines.vllm.adapter.spec_counters`) cannot serve per variant here: every new instance
re-registers vLLM's collectors in the process-wide Prometheus registry, so it reads the instance loaded last
only; after the timed calls, one untimed call on that instance checks that its ``get_metrics()`` counters
move exactly as the per-request metrics say (``counter_check`` in the report). Engine settings: float32,
``enforce_eager``, ``max_model_len`` = prompt + new tokens + k + 1, a KV cache of :data:`KV_CACHE_BYTES`,
``max_num_seqs`` = B, one torch / OpenMP / numba thread by default (``--threads``: ``OMP_NUM_THREADS`` and
``NUMBA_NUM_THREADS``): with vLLM's defaults its OpenMP threads wait on one another, and once an ``ngram`` instance
has run its numba ``parallel=True`` proposer (numba's OpenMP layer, all cores) every instance of the process slows
down unless ``NUMBA_NUM_THREADS`` is set as well (measured: docs/profile.md, "Threads").

Pair: ``wide-exact`` (default) is :mod:`specdec_ref.exact.wide`'s pair (an 8 x 512 Llama realising
``order1-target`` against a 1 x 64 ``order1-draft-close``), written as checkpoints to a temporary folder with the
order1 tokenizer files; vLLM's CPU attention must accept both head sizes (64 and 32 by default; checked against
``CPUAttentionBackend.get_supported_head_sizes()``, else the run falls back to ``exact:order1-close`` and says
why). ``exact:NAME`` is a shipped engine-ready exact pair (tiny: one layer of hidden 16 each side, 128 positions:
a step costs the engine's per-step overhead, not the model, so the draft is as dear as the target; docs/profile.md
has the measurement). On the order1 pairs, sampled runs also get the
exact expected acceptance (:mod:`conformance.engines.efficiency`) beside vLLM's counters.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from specdec_bench.kit import environment, load_average
from specdec_bench.profile_engine import Completion, EngineVariant, sum_counters, add_profile_engine_arguments, engine_kwargs, \
    request_seeds, run_interleaved, summarise, variants_for, write_engine_report
from specdec_bench.profile_timing import log_stderr

from conformance.engines.vllm.adapter import ADAPTER, spec_counters, vllm_sampling_kwargs

config = ADAPTER.config

__all__ = ["KV_CACHE_BYTES", "VLLMEngines", "prepare_pair", "request_counters", "profile_vllm", "main"]

#: KV cache of each engine instance (the wide target holds 32 KiB per token, its draft 0.5 KiB).
KV_CACHE_BYTES = 128 << 20
WIDE_TABLES = {"target": "order1-target", "draft": "order1-draft-close"}
FALLBACK_PAIR = "exact:order1-close"
DESIGN = ("design: one vllm.LLM per variant, all in this process (in-process engine core; an idle instance runs nothing), "
          "generate calls interleaved on the same token-id prompts and request seeds, each timed by the tool")


def _env(threads: int) -> None:
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the legacy setting would override kv_cache_memory_bytes
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("NUMBA_NUM_THREADS", str(threads))


def _cpu_head_sizes() -> list[int] | None:
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:  # another vLLM layout: let the load decide
        return None
    return list(CPUAttentionBackend.get_supported_head_sizes())


def _random_prompts(n: int, length: int, seed: int, vocab: int, bos: int | None) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = [t for t in range(vocab) if t != bos]
    out = []
    for _ in range(n):
        picks = torch.randint(0, len(ids), (length - (bos is not None),), generator=gen).tolist()
        out.append(([bos] if bos is not None else []) + [ids[i] for i in picks])
    return out


def long_prompts(n: int, length: int, seed: int) -> list[list[int]]:
    """Prompts in the long family's law: ``<bos>``, ordinary tokens, one marker half-way (the law reads it from
    anywhere behind), as the serving conditions draw them (:func:`conformance.engines.conditions.random_prompt`)."""
    from conformance.engines.conditions import random_prompt

    return [list(random_prompt(length, seed * 1_000 + i, "long", marker=(length // 2, i % 4))) for i in range(n)]


def prepare_pair(pair: str, folder: Path, *, prompts: int, length: int, seed: int) -> dict:
    """The checkpoints vLLM loads and the prompts: ``{"target", "draft", "prompts", "description", "reason",
    "positions", "efficiency_pair"}`` (``efficiency_pair``: the exact pair whose tables the models realise, when
    the exact acceptance expectation applies, else None)."""
    from specdec_ref.exact import exact_model, exact_pair

    if pair == "wide-exact":
        from specdec_bench.profile import load_pair

        target, draft, make_prompts, description, _ = load_pair("wide-exact")
        heads = {name: net.config.head_dim for name, net in (("target", target), ("draft", draft))}
        supported = _cpu_head_sizes()
        bad = {n: h for n, h in heads.items() if supported is not None and h not in supported}
        if not bad:
            for name, net in (("target", target), ("draft", draft)):
                net.save_pretrained(folder / name)
                for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
                    shutil.copy(exact_model(WIDE_TABLES[name]).path / f, folder / name / f)
            return {"target": str(folder / "target"), "draft": str(folder / "draft"),
                    "prompts": [p[0].tolist() for p in make_prompts(prompts, length, seed)], "description": description,
                    "reason": f"the wide exact pair (speculation pays on it in the reference's profile); head sizes "
                              f"{heads['target']} (target) and {heads['draft']} (draft), both in vLLM's CPU attention list "
                              f"{supported if supported is not None else '(not found: left to the load)'}",
                    "positions": target.config.max_position_embeddings, "efficiency_pair": "order1-close"}
        why = f"the wide exact pair's head sizes {bad} are not in vLLM's CPU attention list {supported}"
        fallback = prepare_pair(FALLBACK_PAIR, folder, prompts=prompts, length=length, seed=seed)
        return {**fallback, "reason": f"{why}: fell back to {FALLBACK_PAIR}"}
    if not pair.startswith("exact:"):
        raise ValueError(f"unknown pair {pair!r}: wide-exact or exact:NAME")
    p = exact_pair(pair.removeprefix("exact:"))
    order1 = p.target.family == "order1" and not p.target.logit_offset and not p.draft.logit_offset
    return {"target": str(p.target.path), "draft": str(p.draft.path),
            "prompts": (long_prompts(prompts, length, seed) if p.target.family == "long" else
                        _random_prompts(prompts, length, seed, p.target.vocab, p.target.bos_id)),
            "description": f"exact pair {p.name} ({p.target.name} against {p.draft.name}: {p.purpose}; shipped checkpoints)",
            "reason": f"{pair} was asked for: a shipped engine-ready exact pair", "positions": min(p.target.max_positions, p.draft.max_positions),
            "efficiency_pair": p.name if order1 else None}


class VLLMEngines:
    """One ``vllm.LLM`` per variant in this process, and the :class:`specdec_bench.profile_engine.Engine` calls on them."""

    def __init__(self, target: str, draft: str, variants, *, mode: str, new_tokens: int, max_model_len: int, batch: int,
                 draft_sample: str, seed: int, kv_cache_bytes: int = KV_CACHE_BYTES, log=None):
        from vllm import LLM

        from specdec_ref.warp import GREEDY, SamplingConfig

        self.sampling = GREEDY if mode == "greedy" else SamplingConfig(temperature=1.0)
        self.new_tokens = new_tokens
        self.llms, self.load_seconds = {}, {}
        options = {"draft_model": config("draft-greedy" if draft_sample == "greedy" else "draft-prob").options,
                   "ngram": config("ngram").options}
        try:
            for v in variants:
                spec = None
                if v.method is not None:
                    spec = {"method": v.method, "num_speculative_tokens": v.k, **options[v.method]}
                    spec.update({"model": draft} if v.method == "draft_model" else {})
                t0 = time.perf_counter()
                self.llms[v.label] = LLM(model=target, speculative_config=spec, dtype="float32", enforce_eager=True,
                                         max_model_len=max_model_len, seed=seed, max_num_seqs=max(batch, 1),
                                         kv_cache_memory_bytes=kv_cache_bytes, disable_log_stats=False,
                                         per_request_spec_decode_metrics="summary" if spec else "none")
                self.last = v
                self.load_seconds[v.label] = time.perf_counter() - t0
                if log:
                    log(f"  loaded {v.label} in {self.load_seconds[v.label]:.1f} s")
        except BaseException:
            self.close()
            raise

    def generate(self, variant: EngineVariant, prompts: list[list[int]], seeds: list[int] | None) -> list[Completion]:
        from vllm import SamplingParams

        params = [SamplingParams(**vllm_sampling_kwargs(self.sampling, max_new_tokens=self.new_tokens, eos=False, eos_id=0, seed=s))
                  for s in (seeds or [None] * len(prompts))]
        outs = self.llms[variant.label].generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        done = []
        for o in outs:
            m = getattr(o, "metrics", None)
            stamps = (m.first_token_ts, m.last_token_ts) if m is not None and getattr(m, "last_token_ts", 0) else (None, None)
            done.append(Completion([int(t) for t in o.outputs[0].token_ids], *stamps,
                                   counters=request_counters(o.outputs[0].spec_decode_metrics)))
        return done

    def counter_check(self, prompts: list[list[int]], seeds: list[int] | None) -> dict | None:
        """One untimed call on the instance loaded last: its ``get_metrics()`` counters' change against the
        per-request metrics of the same call (None when that instance does not speculate)."""
        if self.last.method is None:
            return None
        llm = self.llms[self.last.label]
        before = spec_counters(llm)
        outs = self.generate(self.last, prompts, seeds)
        after = spec_counters(llm)
        registry = {key: after[key] - before[key] for key in ("drafts", "draft_tokens", "accepted")}
        registry["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"] or [], before["accepted_per_pos"] or [0] * 64)]
        per_request = sum_counters([c.counters for c in outs if c.counters]) or {}
        return {"variant": self.last.label, "registry": registry, "per_request": per_request, "agree": registry == per_request}

    def close(self) -> None:
        for llm in self.llms.values():
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self.llms = {}


def request_counters(metrics) -> dict | None:
    """vLLM's per-request ``RequestSpecDecodeMetrics`` as counters: ``histogram[j]`` rounds accepted ``j`` drafts, so
    ``accepted_per_pos[i]`` (rounds accepting draft i + 1) = the rounds with more than ``i`` accepted."""
    if metrics is None:
        return None
    h = [int(x) for x in metrics.histogram]
    return {"drafts": sum(h), "draft_tokens": int(metrics.num_draft_tokens), "accepted": sum(j * n for j, n in enumerate(h)),
            "accepted_per_pos": [sum(h[i + 1:]) for i in range(len(h) - 1)]}


def _efficiency(row: dict, pair: str, mode: str, draft_sample: str, prompts: list[list[int]], new_tokens: int) -> dict | None:
    """vLLM's counters against the exact acceptance expectation of the pair's tables (sampled draft_model variants)."""
    from conformance.engines.efficiency import compare, expectation_for

    acc = row.get("acceptance")
    if mode != "sampling" or row["method"] != "draft_model" or not acc:
        return None
    scheme = "one_hot" if draft_sample == "greedy" else "token"
    exp = expectation_for(pair, scheme, 1.0, row["k"], tuple(p[-1] for p in prompts), new_tokens)
    out = compare(acc, exp, k=row["k"])
    return {key: out.get(key) for key in ("verdict", "passed", "tolerance_se", "acceptance_per_token", "expected_acceptance_per_token",
                                         "positions")}


def profile_vllm(*, pair: str = "wide-exact", ks=(1, 2, 4), ngram_k: int = 0, draft_sample: str = "probabilistic", batch: int = 1,
                 prompts: int = 4, prompt_length: int = 32, new_tokens: int = 48, repeats: int = 5, warmup: int = 1,
                 mode: str = "greedy", threads: int = 1, seed: int = 0, patch: str = "", kv_cache_bytes: int = KV_CACHE_BYTES,
                 log=log_stderr) -> dict:
    """The report dict (JSON-able) of vLLM's speculation against its plain decoding (module docstring)."""
    if min(ks) < 1 or repeats < 1 or prompts < 1 or batch < 1 or new_tokens < 2 or ngram_k < 0:
        raise ValueError("need k >= 1, repeats, prompts and batch >= 1, new_tokens >= 2")
    _env(threads)
    import torch

    torch.set_num_threads(threads)  # before the first LLM: vLLM's CPU worker then disables torch.set_num_threads
    if patch:
        from conformance.engines.vllm import patch as vllm_patch

        vllm_patch.apply(*patch.split(","))
    import vllm

    variants = variants_for(ks, ngram_k)
    load_before, started = load_average(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specdec-vllm-profile-") as tmp:
        chosen = prepare_pair(pair, Path(tmp), prompts=prompts * batch, length=prompt_length, seed=seed)
        max_model_len = prompt_length + new_tokens + max(v.k for v in variants) + 1
        if max_model_len > chosen["positions"]:
            raise ValueError(f"prompt {prompt_length} + new tokens {new_tokens} + k exceeds the pair's {chosen['positions']} positions")
        if log:
            log(f"profile-engine vllm {vllm.__version__}: {chosen['description']}; {[v.label for v in variants]}, {mode}")
        engines = VLLMEngines(chosen["target"], chosen["draft"], variants, mode=mode, new_tokens=new_tokens, max_model_len=max_model_len,
                              batch=batch, draft_sample=draft_sample, seed=seed, kv_cache_bytes=kv_cache_bytes, log=log)
        try:
            flat = chosen["prompts"]
            units = [flat[u * batch:(u + 1) * batch] for u in range(prompts)]
            runs = run_interleaved(engines, variants, units, repeats=repeats, sampled=mode == "sampling", seed=seed, warmup=warmup,
                                   log=log)
            check = engines.counter_check(units[0], request_seeds(seed, 0, -1, batch) if mode == "sampling" else None)
            threads_seen = torch.get_num_threads()
        finally:
            engines.close()
    summary = summarise(runs, variants, prompts, seed=seed, greedy=mode == "greedy")
    if chosen["efficiency_pair"]:
        requests = [p for _ in range(repeats) for p in flat]
        for row in summary["rows"]:
            row["efficiency"] = _efficiency(row, chosen["efficiency_pair"], mode, draft_sample, requests, new_tokens)
    return {
        "title": f"vllm {vllm.__version__} on the {pair} pair, B={batch}, {mode}", "engine": "vllm", "engine_version": vllm.__version__,
        "pair": chosen["description"], "pair_reason": chosen["reason"], "design": DESIGN,
        "settings": dict(pair=pair, ks=sorted(set(ks)), ngram_k=ngram_k, draft_sample=draft_sample, batch=batch, prompts=prompts,
                         prompt_length=prompt_length, new_tokens=new_tokens, repeats=repeats, warmup=warmup, mode=mode,
                         threads=threads, torch_threads_seen=threads_seen, omp_num_threads=os.environ.get("OMP_NUM_THREADS"), seed=seed, patch=patch, max_model_len=max_model_len,
                         kv_cache_bytes=kv_cache_bytes),
        **summary, "load_seconds": engines.load_seconds, "counter_check": check,
        "environment": environment(), "load_average": {"before": load_before, "after": load_average()},
        "seconds": time.perf_counter() - started,
    }


def main(argv=None) -> int:
    import json

    from specdec_bench.kit import jsonable
    from specdec_bench.profile_report import text_report
    from specdec_bench.profile_engine import sections

    ap = argparse.ArgumentParser(prog="python -m specdec_bench.vllm_profile", description=__doc__.split("\n")[0])
    add_profile_engine_arguments(ap, engine=False)
    ap.add_argument("--kwargs", default=None, help=argparse.SUPPRESS)  # specdec_bench.profile_engine.run_engine: profile_vllm's kwargs as JSON
    ap.add_argument("--report", default=None, help=argparse.SUPPRESS)  # ... and where the report goes
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    kwargs = json.loads(args.kwargs) if args.kwargs else engine_kwargs(args)
    threads = str(kwargs.get("threads", 1))
    if os.environ.get("OMP_NUM_THREADS") != threads:  # OpenMP reads it once, when torch loads: start again with it set
        os.execve(sys.executable, [sys.executable, "-m", "specdec_bench.vllm_profile", *argv],
                  {**os.environ, "OMP_NUM_THREADS": threads})
    report = profile_vllm(**kwargs)
    if args.report:
        Path(args.report).write_text(json.dumps(jsonable(report)))
        return 0
    if args.out:
        report["files"] = write_engine_report(report, args.out, args.stem)
    print(text_report(report, sections_of=sections))
    return int(any(r.get("greedy_mismatches") for r in report["rows"]))


if __name__ == "__main__":
    sys.exit(main())
