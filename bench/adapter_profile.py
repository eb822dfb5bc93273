"""``specdec-bench profile-engine --engine NAME --configs a,b``: the speedup profile of any registered engine adapter.

The same design as :mod:`specdec_bench.profile_engine` (paired, interleaved, timed by the tool, bootstrap intervals, the
verdict line), driven through the engine-neutral layer (:mod:`conformance.engines.adapter`) instead of one
engine's own API: every variant is one of the adapter's configurations (its control is AR), each opened once as an
:class:`~conformance.engines.adapter.EngineSession` on the adapter's exact pair of the chosen family, all in this
process (for a server engine: one server per variant, each idle while another is timed); every timed call is
``session.generate`` on one unit of prompts. Counters: the session's own (``counters()``, their change around the
call, attached to the call's first completion) or, where the engine reports them per request, their sum. Where a
record carries ``decode_s`` (the engine's own time from the first generated token on: llama-server's
``timings.predicted_ms`` under a condition), the decode-only ratio is reported too (a unit's span: its longest). A sampled
configuration with a declared scheme gets its acceptance compared with the exact expectation
(:mod:`conformance.engines.efficiency`, order1 family). Run in the adapter's interpreter (its venv) by
:func:`specdec_bench.profile_engine.run_engine`.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specdec_bench.kit import environment, load_average
from specdec_bench.profile_engine import AR, Completion, EngineVariant, run_interleaved, summarise
from specdec_bench.profile_timing import log_stderr

__all__ = ["AdapterEngines", "profile_adapter", "main"]

DESIGN = ("design: one engine session per variant (the adapter's configurations), all opened in this process and idle "
          "while another is timed; generate calls interleaved on the same token-id prompts and request seeds, each timed "
          "by the tool")


def variant_of(ad, cfg) -> EngineVariant:
    return AR if not cfg.speculative else EngineVariant(cfg.name, ad.k_of(cfg))


def _prompts(n: int, length: int, seed: int, vocab: int, bos: int | None, eos: int | None) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    ids = [t for t in range(vocab) if t not in (bos, eos)]
    return [([bos] if bos is not None else []) + [rng.choice(ids) for _ in range(length - (bos is not None))]
            for _ in range(n)]


class AdapterEngines:
    """One session per variant, and the :class:`specdec_bench.profile_engine.Engine` calls on them."""

    def __init__(self, ad, configs, family: str, *, sampling, new_tokens: int, eos_id: int, log=None,
                 context: int | None = None):
        """``context``: positions the requests need past the adapter's ``max_model_len``; each session is then opened
        with the ``max_model_len`` knob of a serving condition (and the prefix cache off: every call prefills)."""
        from conformance.engines.conditions import Condition

        self.ad, self.sampling, self.new_tokens, self.eos_id = ad, sampling, new_tokens, eos_id
        self.sessions, self.load_seconds, self.by_label = {}, {}, {}
        wide = None if context is None else Condition(
            "profile-context", {"max_model_len": int(context), "prefix_caching": False}, (),
            "a profile at a context longer than the adapter's default", ())
        try:
            for cfg in configs:
                v = variant_of(ad, cfg)
                t0 = time.perf_counter()
                self.sessions[v.label] = ad.open(cfg, family) if wide is None else ad.open_condition(cfg, family, wide)
                self.load_seconds[v.label] = time.perf_counter() - t0
                self.by_label[v.label] = cfg
                if log:
                    log(f"  opened {cfg.name} ({v.label}) in {self.load_seconds[v.label]:.1f} s")
        except BaseException:
            self.close()
            raise

    def generate(self, variant: EngineVariant, prompts, seeds) -> list[Completion]:
        from conformance.engines.adapter import Request
        from conformance.engines.worker import delta

        session = self.sessions[variant.label]
        reqs = [Request("profile", tuple(p), self.sampling, self.new_tokens, False, self.eos_id, s)
                for p, s in zip(prompts, seeds or [None] * len(prompts))]
        before = session.counters()
        outs = session.generate(reqs)
        call = delta(session.counters(), before)
        done = []
        for i, o in enumerate(outs):
            counters = None
            if call is not None:
                counters = call if i == 0 else None
            elif "draft_tokens" in o:
                counters = {"drafts": 1 if o["draft_tokens"] else 0, "draft_tokens": int(o["draft_tokens"]),
                            "accepted": int(o.get("accepted") or 0), "accepted_per_pos": None}
            decode = o.get("decode_s")  # the engine's own time of the request's generation, where it reports it
            done.append(Completion([int(t) for t in o["completion_ids"]], first=None if decode is None else 0.0,
                                   last=decode, counters=counters))
        return done

    def close(self) -> None:
        for s in self.sessions.values():
            try:
                s.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self.sessions = {}


def _efficiency(ad, cfg, row: dict, pair: str, prompts_last, new_tokens: int) -> dict | None:
    from conformance.engines.efficiency import compare, expectation_for

    acc = row.get("acceptance")
    if cfg.scheme not in ("token", "one_hot", "block", "sample_match") or not acc:
        return None
    k = ad.k_of(cfg)
    exp = expectation_for(pair, cfg.scheme, 1.0, k, tuple(prompts_last), new_tokens,
                          prefill=ad.conventions.first_token_at_prefill)
    out = compare({**acc, "accepted_per_pos": acc.get("accepted_per_pos") or None}, exp, k=k)
    return {key: out.get(key) for key in ("verdict", "passed", "tolerance_se", "acceptance_per_token",
                                         "expected_acceptance_per_token", "positions")}


def profile_adapter(*, engine: str, configs: list[str], family: str = "order1", batch: int = 1, prompts: int = 4,
                    prompt_length: int = 8, new_tokens: int = 16, repeats: int = 5, warmup: int = 1, mode: str = "greedy",
                    seed: int = 0, log=log_stderr) -> dict:
    """The report dict (JSON-able) of an adapter's speculative configurations against its control."""
    from conformance.engines.adapter import adapter
    from specdec_ref.exact import exact_pair
    from specdec_ref.warp import GREEDY, SamplingConfig

    ad = adapter(engine)
    chosen = [ad.config(c) for c in configs]
    if sum(not c.speculative for c in chosen) != 1 or len(chosen) < 2:
        raise ValueError("give exactly one configuration without speculation (AR) and at least one speculative one")
    chosen.sort(key=lambda c: c.speculative)
    pair = exact_pair(ad.families[family])
    longest = prompt_length + new_tokens + max(ad.k_of(c) for c in chosen) + 1
    positions = min(pair.target.max_positions, pair.draft.max_positions)
    context = None
    if longest > ad.max_model_len:  # past the adapter's default: its max_model_len knob (open_condition raises where
        if longest > positions:      # it has none), up to the pair's positions
            raise ValueError(f"prompt {prompt_length} + new tokens {new_tokens} + k + 1 = {longest} exceeds {ad.title}'s "
                             f"{ad.max_model_len} positions in this adapter and the {pair.name} pair's {positions}: use a "
                             "shorter --prompt-length / --new-tokens, or the long family")
        context = positions
    variants = [variant_of(ad, c) for c in chosen]
    sampling = GREEDY if mode == "greedy" else SamplingConfig(temperature=1.0)
    t = pair.target
    if t.family == "long":
        from specdec_bench.vllm_profile import long_prompts

        flat = long_prompts(prompts * batch, prompt_length, seed)
    else:
        flat = _prompts(prompts * batch, prompt_length, seed, t.vocab, t.bos_id, int(t.eos_id))
    units = [flat[u * batch:(u + 1) * batch] for u in range(prompts)]
    load_before, started = load_average(), time.perf_counter()
    version = ad.installed_version()
    if log:
        log(f"profile-engine {ad.name} {version}: pair {pair.name}; {[v.label for v in variants]}, {mode}")
    engines = AdapterEngines(ad, chosen, family, sampling=sampling, new_tokens=new_tokens, eos_id=int(t.eos_id), log=log,
                             context=context)
    try:
        runs = run_interleaved(engines, variants, units, repeats=repeats, sampled=mode == "sampling", seed=seed,
                               warmup=warmup, log=log)
    finally:
        engines.close()
    summary = summarise(runs, variants, prompts, seed=seed, greedy=mode == "greedy")
    if mode == "sampling" and family == "order1":
        last = [p[-1] for _ in range(repeats) for p in flat]
        for row in summary["rows"]:
            row["efficiency"] = _efficiency(ad, engines.by_label[row["variant"]], row, pair.name, last, new_tokens)
    return {
        "title": f"{ad.name} {version} on the {pair.name} pair, B={batch}, {mode}", "engine": ad.name,
        "engine_version": version, "pair": f"exact pair {pair.name} ({pair.purpose})",
        "pair_reason": f"the adapter's {family} family", "design": DESIGN,
        "settings": dict(engine=engine, configs=[c.name for c in chosen], family=family, batch=batch, prompts=prompts,
                         prompt_length=prompt_length, new_tokens=new_tokens, repeats=repeats, warmup=warmup, mode=mode,
                         threads=0, seed=seed, patch=""),
        **summary, "load_seconds": engines.load_seconds, "counter_check": None,
        "environment": environment(), "load_average": {"before": load_before, "after": load_average()},
        "seconds": time.perf_counter() - started,
    }


def main(argv=None) -> int:
    from specdec_bench.kit import jsonable

    ap = argparse.ArgumentParser(prog="python -m specdec_bench.adapter_profile", description=__doc__.split("\n")[0])
    ap.add_argument("--kwargs", required=True, help="profile_adapter's keyword arguments as JSON")
    ap.add_argument("--report", required=True, help="where the report goes (JSON)")
    args = ap.parse_args(argv)
    report = profile_adapter(**json.loads(args.kwargs))
    Path(args.report).write_text(json.dumps(jsonable(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
