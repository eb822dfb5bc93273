"""``specdec-bench decoder``: AR vs our speculative decoder vs transformers' assisted generation.

Tokens/s of AR decoding, :class:`specdec_ref.decode.SpeculativeDecoder` (k grid) and transformers'
assisted generation (pinned to the same k) on the shipped trained pair, greedy and sampling,
variants interleaved over the repeats; acceptance, calls per token, phase shares, token-for-token
equality with AR (greedy) and with transformers at the same seed, and the ">= 2x transformers'
assisted generation" goal verdict. transformers' rounds are recovered with
:class:`specdec_ref.adapters.hf_backends.ForwardProbe` and :func:`specdec_ref.adapters.hf_backends.hf_assisted_drafts`.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig

from specdec_ref.decode import SpeculativeDecoder, autoregressive_decode
from specdec_ref.adapters.hf_backends import ForwardProbe, hf_assisted_drafts, hf_sampling_options, pinned_draft_length
from specdec_ref.pretrained import CONTEXT_LENGTH, load_trained_pair, sample_prompts
from specdec_ref.static_cache import fastest_cache
from specdec_ref.warp import GREEDY, SamplingConfig

from .kit import Column, Subcommand, choice_list, columns, fmt_float, int_list, load_average, percentile

#: The project's goal for the decoder: our speculative decoder at >= this many times the throughput of
#: transformers' assisted generation on the same pair and settings.
GOAL_VS_HF_ASSISTED = 2.0
#: ar: the oracle (transformers forward); ar-lean: the same with the spec decoder's own cache/forward
#: (``make_cache=fastest_cache``); hf-ar: plain ``target.generate`` (greedy or sampling, no assistant).
DECODER_VARIANTS = ("ar", "ar-lean", "spec", "hf-assisted", "hf-ar")
_NO_K = ("ar", "ar-lean", "hf-ar")


def _fmt_share(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.0f}"


DECODER_COLUMNS = [
    *columns(mode="mode", label="variant"),
    *columns(fmt_float(0), tokens_per_s_median="tok/s med", tokens_per_s_p10="p10", tokens_per_s_p90="p90"),
    *columns(fmt_float(2), vs_ar="x AR", vs_ar_lean="x lean", vs_hf_assisted="x hf(k)"),
    Column("tokens_per_cpu_s_median", "tok/cpu-s", fmt_float(0)),
    Column("cpu_vs_hf_assisted", "x hf(k) cpu", fmt_float(2)),
    Column("acceptance", "accept", fmt_float(3)),
    Column("tokens_per_round", "tok/rnd", fmt_float(2)),
    *columns(fmt_float(1), target_calls_per_100="tgt/100", draft_calls_per_100="drf/100"),
    Column("host_syncs_per_round", "sync/rnd", fmt_float(2)),
    *columns(_fmt_share, draft_share="draft%", verify_share="verify%", repair_share="repair%", forward_share="fwd%"),
    Column("k_exact", "k exact", lambda v: "-" if v is None else ("yes" if v else "NO")),
    *columns(equals_ar_text="= AR", equals_hf_text="= hf(k)"),
]


def add_decoder_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mode",
        type=choice_list("greedy", "sampling"),
        default=["greedy", "sampling"],
        help="greedy,sampling (default both; sampling = temperature 1, no top-k/top-p)",
    )
    p.add_argument("--k", type=int_list, default=list(range(1, 9)), help="draft lengths for spec and hf-assisted (default 1,2,3,4,5,6,7,8)")
    p.add_argument("--new-tokens", type=int, default=128, help="new tokens per prompt (default 128; prompt + new tokens <= 256)")
    p.add_argument("--prompts", type=int, default=4, help="prompts from sample_prompts(n, length, seed=0) (default 4)")
    p.add_argument("--prompt-length", type=int, default=64, help="prompt length in bytes (default 64)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved timed repeats, rotating the variant order (default 5)")
    p.add_argument(
        "--variants",
        type=choice_list(*DECODER_VARIANTS),
        default=list(DECODER_VARIANTS),
        help=f"{','.join(DECODER_VARIANTS)} (default all; ar is the reference of the x AR column and of the greedy equality check)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument(
        "--seed", type=int, default=0, help="base seed of the sampling generators (one seed per repeat and prompt, shared by the variants)"
    )


def _decoder_seed(base: int, repeat: int, prompt: int) -> int:
    return base * 1_000_003 + (repeat + 1) * 1_009 + prompt


@dataclass
class _DecoderVariant:
    name: str  # one of DECODER_VARIANTS
    k: int | None

    @property
    def label(self) -> str:
        return self.name if self.k is None else f"{self.name} k={self.k}"


def _decoder_call(variant: _DecoderVariant, target, draft, prompt, *, new_tokens: int, sampling, seed: int, probes) -> dict:
    """One generation: tokens, wall and CPU seconds, and the per-call counters of every variant."""
    for probe in probes.values():
        probe.reset()
    prompt_len = prompt.shape[1]
    record: dict[str, Any] = {}
    if variant.name in ("ar", "ar-lean", "spec"):
        generator = torch.Generator().manual_seed(seed)
        decoder = SpeculativeDecoder() if variant.name == "spec" else None
        ar_options = dict(make_cache=fastest_cache) if variant.name == "ar-lean" else {}
        c0, t0 = time.process_time(), time.perf_counter()
        if decoder is None:
            result = autoregressive_decode(target, prompt, max_new_tokens=new_tokens, sampling=sampling, generator=generator, **ar_options)
        else:
            result = decoder.decode(
                target, draft, prompt, k=variant.k, max_new_tokens=new_tokens, sampling=sampling, generator=generator, timed=True
            )
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        tokens = list(result.tokens)
        hooked = (len(probes["target"].calls), len(probes["draft"].calls))
        if hooked != (0, 0) and hooked != (result.target_calls, result.draft_calls):
            raise RuntimeError(
                f"{variant.label}: the decoder counted {result.target_calls}/{result.draft_calls} target/draft calls, "
                f"the forward hooks {hooked[0]}/{hooked[1]}"
            )
        record.update(
            target_calls=result.target_calls,
            draft_calls=result.draft_calls,
            host_syncs=result.host_syncs,
            phases=dict(result.seconds),
            # None where the lean static forward bypasses the transformers module (and its hooks)
            forward_seconds=probes["target"].seconds + probes["draft"].seconds if hooked != (0, 0) else None,
        )
        if variant.name == "spec":
            rounds = result.rounds
            record.update(
                rounds=len(rounds),
                proposed=sum(r.proposed for r in rounds),
                accepted=sum(r.accepted for r in rounds),
                k_exact=all(r.proposed == min(variant.k, new_tokens - (r.start - prompt_len) - 1) for r in rounds),
            )
        else:
            record.update(rounds=len(tokens))  # one target call, one host sync per token
    else:
        config = GenerationConfig(
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0, eos_token_id=None, **hf_sampling_options(sampling)
        )
        assisted = variant.name == "hf-assisted"
        mask = torch.ones_like(prompt)
        # the draft length is read from the draft's own generation_config (see pinned_draft_length)
        with pinned_draft_length(draft, variant.k) if assisted else contextlib.nullcontext():
            torch.manual_seed(seed)  # transformers samples from the global generator
            c0, t0 = time.process_time(), time.perf_counter()
            if assisted:
                out = target.generate(prompt, attention_mask=mask, assistant_model=draft, generation_config=config)
            else:
                out = target.generate(prompt, attention_mask=mask, generation_config=config)
            seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        tokens = out[0, prompt_len:].tolist()
        record.update(
            rounds=len(probes["target"].calls),
            target_calls=len(probes["target"].calls),
            draft_calls=len(probes["draft"].calls),
            host_syncs=None,
            phases=None,
            forward_seconds=probes["target"].seconds + probes["draft"].seconds,
        )
        if assisted:
            drafts = hf_assisted_drafts(probes["target"].calls, prompt_len)
            max_length = prompt_len + new_tokens
            record.update(
                proposed=sum(d for d, _ in drafts),
                accepted=len(tokens) - len(drafts),  # each round commits its matches + 1 (no EOS, no budget cut)
                k_exact=all(d == min(variant.k, max_length - cur - 1) for d, cur in drafts),
            )
    if len(tokens) != new_tokens:
        raise RuntimeError(f"{variant.label} generated {len(tokens)} tokens, expected {new_tokens}")
    record.update(tokens=tokens, seconds=seconds, cpu_seconds=cpu_seconds)
    return record


def run_decoder(args: argparse.Namespace) -> list[dict]:
    if args.prompt_length + args.new_tokens > CONTEXT_LENGTH:
        raise SystemExit(f"--prompt-length {args.prompt_length} + --new-tokens {args.new_tokens} exceeds the pair's context {CONTEXT_LENGTH}")
    if min(args.k, default=1) < 1 or args.new_tokens < 1 or args.prompts < 1 or args.repeats < 1:
        raise SystemExit("--k, --new-tokens, --prompts and --repeats must be >= 1")
    variants = [
        _DecoderVariant(name, k)
        for name in DECODER_VARIANTS
        if name in args.variants
        for k in ((None,) if name in _NO_K else args.k)
    ]
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    target, draft = load_trained_pair()
    probes = {"target": ForwardProbe(target), "draft": ForwardProbe(draft)}
    prompts = sample_prompts(args.prompts, length=args.prompt_length, seed=0)
    rows: list[dict] = []
    try:
        for mode in args.mode:
            sampling = GREEDY if mode == "greedy" else SamplingConfig(temperature=1.0)
            call = lambda v, i, r: _decoder_call(  # noqa: E731
                v, target, draft, prompts[i], new_tokens=args.new_tokens, sampling=sampling,
                seed=_decoder_seed(args.seed, r, i), probes=probes,
            )  # fmt: skip
            for v in variants:  # warm-up: every variant once (lazy init, allocator, transformers' first generate)
                call(v, 0, -1)
            runs: dict[str, list[list[dict]]] = {v.label: [] for v in variants}  # label -> repeat -> prompt
            for r in range(args.repeats):
                for v in variants:
                    runs[v.label].append([])
                for i in range(len(prompts)):  # every variant on one prompt, then the next: compared runs stay seconds apart
                    shift = (r * len(prompts) + i) % len(variants)
                    for v in variants[shift:] + variants[:shift]:
                        runs[v.label][r].append(call(v, i, r))
                print(f"  [{mode}] repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
            mode_rows = _decoder_rows(mode, variants, runs, args)
            for row in mode_rows:
                row["load_average"] = load_average()
            rows.extend(mode_rows)
    finally:
        for probe in probes.values():
            probe.remove()
        torch.set_num_threads(previous_threads)
    return rows


def _decoder_rows(mode: str, variants: list[_DecoderVariant], runs: dict[str, list[list[dict]]], args) -> list[dict]:
    reference = runs.get("ar")
    rows = []
    for v in variants:
        reps = runs[v.label]
        flat = [rec for rep in reps for rec in rep]
        tokens = sum(len(x["tokens"]) for x in flat)
        wall = [sum(x["seconds"] for x in rep) for rep in reps]
        rates = [sum(len(x["tokens"]) for x in rep) / w for rep, w in zip(reps, wall)]
        cpu_rates = [sum(len(x["tokens"]) for x in rep) / sum(x["cpu_seconds"] for x in rep) for rep in reps]
        rounds = sum(x["rounds"] for x in flat)
        row: dict[str, Any] = dict(
            mode=mode,
            variant=v.name,
            k=v.k,
            label=v.label,
            prompts=args.prompts,
            prompt_length=args.prompt_length,
            new_tokens=args.new_tokens,
            repeats=len(reps),
            threads=args.threads,
            tokens_per_s=rates,
            tokens_per_s_median=percentile(rates, 50),
            tokens_per_s_p10=percentile(rates, 10),
            tokens_per_s_p90=percentile(rates, 90),
            tokens_per_cpu_s=cpu_rates,
            tokens_per_cpu_s_median=percentile(cpu_rates, 50),
            acceptance=None,
            tokens_per_round=tokens / rounds if rounds else None,
            target_calls_per_100=100 * sum(x["target_calls"] for x in flat) / tokens,
            draft_calls_per_100=100 * sum(x["draft_calls"] for x in flat) / tokens,
            host_syncs_per_round=None,
            forward_share=None,
            k_exact=None,
        )
        if all(x["forward_seconds"] is not None for x in flat):
            row["forward_share"] = percentile([sum(x["forward_seconds"] for x in rep) / w for rep, w in zip(reps, wall)], 50)
        if flat[0].get("proposed") is not None:
            proposed = sum(x["proposed"] for x in flat)
            row["acceptance"] = sum(x["accepted"] for x in flat) / proposed if proposed else None
            row["k_exact"] = all(x["k_exact"] for x in flat)
        if flat[0]["host_syncs"] is not None:
            row["host_syncs_per_round"] = sum(x["host_syncs"] for x in flat) / rounds
        for phase in ("prefill", "draft", "verify", "repair"):
            row[f"{phase}_share"] = None
            if flat[0]["phases"]:
                row[f"{phase}_share"] = percentile([sum(x["phases"][phase] for x in rep) / w for rep, w in zip(reps, wall)], 50)
        if reference is not None and mode == "greedy":
            pairs = [(x["tokens"], ref["tokens"]) for rep, ref_rep in zip(reps, reference) for x, ref in zip(rep, ref_rep)]
            equal = sum(a == b for a, b in pairs)
            diverge = [next(i for i, (s, t) in enumerate(zip(a, b)) if s != t) for a, b in pairs if a != b]
            row.update(equal_runs=equal, runs=len(pairs), equals_ar=equal == len(pairs), first_divergence=min(diverge, default=None))
            row["equals_ar_text"] = "ref" if v.name == "ar" else ("yes" if equal == len(pairs) else f"NO {equal}/{len(pairs)}")
        else:
            row["equals_ar"] = None
            row["equals_ar_text"] = "-"
        rows.append(row)
    by_label = {r["label"]: r for r in rows}
    ar, lean = by_label.get("ar"), by_label.get("ar-lean")
    for row in rows:
        hf = by_label.get(f"hf-assisted k={row['k']}") if row["variant"] == "spec" else None
        row["equals_hf_text"] = "-"
        if hf:  # same k, same prompt, same seed (sampling: transformers draws from the global generator seeded alike)
            pairs = [(x["tokens"], y["tokens"]) for rep, hf_rep in zip(runs[row["label"]], runs[hf["label"]]) for x, y in zip(rep, hf_rep)]
            equal = sum(a == b for a, b in pairs)
            row.update(equal_hf_runs=equal, runs_hf=len(pairs), equals_hf=equal == len(pairs))
            row["equals_hf_text"] = "yes" if equal == len(pairs) else f"NO {equal}/{len(pairs)}"
        for key, ref in (("ar", ar), ("ar_lean", lean), ("hf_assisted", hf)):
            row[f"vs_{key}"] = row["tokens_per_s_median"] / ref["tokens_per_s_median"] if ref else None
            row[f"cpu_vs_{key}"] = row["tokens_per_cpu_s_median"] / ref["tokens_per_cpu_s_median"] if ref else None
    return rows


def summarise_decoder(args: argparse.Namespace, rows: list[dict]) -> list[str]:
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        get = {r["label"]: r for r in mine}
        spec = [r for r in mine if r["variant"] == "spec"]
        hf = {r["k"]: r for r in mine if r["variant"] == "hf-assisted"}
        ar, lean = get.get("ar"), get.get("ar-lean")
        if spec:
            best = max(spec, key=lambda r: r["tokens_per_s_median"])
            line = f"{mode}: best speculative k={best['k']}: {best['tokens_per_s_median']:.0f} tok/s"
            for ref, what in ((ar, "AR (the oracle, transformers forward)"), (lean, "ar-lean (AR on the spec decoder's own lean forward)")):
                if ref:
                    key = "ar" if ref is ar else "ar_lean"
                    ratio = best[f"vs_{key}"]
                    line += (
                        f"; {ratio:.2f}x {what} at {ref['tokens_per_s_median']:.0f} tok/s -> {'faster' if ratio > 1 else 'SLOWER'}"
                        f" (by CPU time {best[f'cpu_vs_{key}']:.2f}x)"
                    )
            lines.append(line)
            same_k = [r for r in spec if r["vs_hf_assisted"] is not None]
            if same_k:
                lines.append(
                    f"{mode}: ours / hf-assisted at the same k (wall; CPU time): "
                    + ", ".join(f"k={r['k']} {r['vs_hf_assisted']:.2f}x; {r['cpu_vs_hf_assisted']:.2f}x" for r in same_k)
                )
            head = (
                f"{mode}: goal (our speculative decoder >= {GOAL_VS_HF_ASSISTED:g}x the throughput of transformers' assisted generation, "
                f"same pair and settings) at our best k={best['k']}: "
            )
            if best["vs_hf_assisted"] is None:
                lines.append(head + f"NOT MEASURED (no hf-assisted k={best['k']} row)")
            else:
                ratio = best["vs_hf_assisted"]
                verdict = "MET" if ratio >= GOAL_VS_HF_ASSISTED else "NOT MET"
                line = head + f"{ratio:.2f}x -> {verdict} (by CPU time {best['cpu_vs_hf_assisted']:.2f}x)"
                if hf:
                    hf_best = max(hf.values(), key=lambda r: r["tokens_per_s_median"])
                    line += f"; vs hf-assisted's own best k={hf_best['k']}: {best['tokens_per_s_median'] / hf_best['tokens_per_s_median']:.2f}x"
                lines.append(line)
            both = [(r, hf[r["k"]]) for r in spec if r["k"] in hf]
            if both:
                differ = [r["k"] for r, h in both if abs(r["acceptance"] - h["acceptance"]) > 1e-9]
                line = f"{mode}: acceptance ours / hf-assisted: " + ", ".join(
                    f"k={r['k']} {r['acceptance']:.3f}/{h['acceptance']:.3f}" for r, h in both
                )
                if mode == "greedy":
                    line += (
                        " -> identical at every k"
                        if not differ
                        else f" -> DIFFERENT at k={','.join(map(str, differ))} (greedy drafts are deterministic)"
                    )
                else:
                    line += " -> identical at every k" if not differ else f" -> differ at k={','.join(map(str, differ))}"
                lines.append(line)
                same = [r for r, _ in both if r.get("equals_hf")]
                runs_hf = sum(r["runs_hf"] for r, _ in both)
                lines.append(
                    f"{mode}: ours equals hf-assisted token for token (same k, prompt and seed): "
                    + (f"yes, all {runs_hf} runs" if len(same) == len(both) else f"at k={','.join(str(r['k']) for r in same) or 'none'} only; "
                       + ", ".join(f"k={r['k']} {r['equal_hf_runs']}/{r['runs_hf']}" for r, _ in both if not r.get("equals_hf")))
                    + ("" if mode == "greedy" else " (both draw from torch generators seeded alike: equality means the same random-stream use)")
                )
        for name, what in (("ar-lean", "ar-lean (AR on the lean static forward)"), ("hf-ar", "hf-ar (plain transformers generate)")):
            if name in get and ar:
                row = get[name]
                lines.append(
                    f"{mode}: {what} {row['tokens_per_s_median']:.0f} tok/s = {row['vs_ar']:.2f}x AR (by CPU time {row['cpu_vs_ar']:.2f}x)"
                )
        pinned = [r for r in hf.values() if not r["k_exact"]]
        if hf:
            lines.append(
                f"{mode}: hf-assisted drafted exactly min(k, tokens left - 1) tokens every round: "
                + ("yes, at every k" if not pinned else "NO at k=" + ",".join(str(r["k"]) for r in pinned))
            )
        if mode == "greedy" and ar:
            unequal = [r for r in mine if r["equals_ar"] is False]
            runs = sum(r["runs"] for r in mine if r["variant"] != "ar")
            lines.append(
                f"{mode}: every output equals AR token for token ({runs} runs)"
                if not unequal
                else f"{mode}: NOT EQUAL to AR: "
                + ", ".join(
                    f"{r['label']} ({r['runs'] - r['equal_runs']}/{r['runs']} runs, first divergence at token {r['first_divergence']})"
                    for r in unequal
                )
            )
    return lines


def decoder_header(args: argparse.Namespace) -> list[str]:
    return [
        f"decoders on the shipped pair (target Llama 2x128, draft Qwen2 1x64, V=256), {args.prompts} prompt(s) of {args.prompt_length} bytes, "
        f"{args.new_tokens} new tokens each, torch threads {args.threads}; after one warm-up call per variant, {args.repeats} repeats in which "
        "the variants run interleaved over the same prompts (all variants on one prompt, then the next; rotating order)",
        "variants: ar = autoregressive_decode (the oracle, transformers forward); ar-lean = the same with make_cache=fastest_cache (the "
        "spec decoder's static-cache lean forward); spec = SpeculativeDecoder().decode; hf-assisted = target.generate(assistant_model=draft), "
        "pinned to k drafts per round through the draft's generation_config; hf-ar = target.generate without assistant",
        "tok/s = new tokens / wall s of the variant's calls in one repeat, median (p10, p90) over repeats; x AR, x lean, x hf(k) = ratios "
        "of medians; tok/cpu-s, x hf(k) cpu: the same with process CPU seconds (robust to other load on a shared machine); "
        "accept = accepted / drafted; tgt/100, drf/100 = model forward calls per 100 new tokens; draft/verify/repair% = median share "
        "of the wall time (timed=True phases, ours only); fwd% = share inside transformers module forwards (hooks; '-' for the lean "
        "forward, which bypasses them); k exact = every round drafted min(k, tokens left - 1); = AR (greedy), = hf(k): token-for-token "
        "equality with ar / with hf-assisted at the same k, prompt and seed",
    ]


SUBCOMMAND = Subcommand(
    "decoder",
    "tokens/s of AR, our speculative decoder and transformers' assisted generation on the shipped trained pair",
    add_decoder_arguments,
    run_decoder,
    DECODER_COLUMNS,
    summarise_decoder,
    decoder_header,
)
