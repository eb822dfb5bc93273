"""``specdec-bench verifier``: throughput of :func:`specdec_ref.verify.verify_block`.

Blocks/s over a (B, k, V, mode, threads) grid, median and p10/p90 over repeats, and the verdict
against the project's goal (:data:`GOAL_BLOCKS_PER_S` at k=4, V=16, sampling, no validation, large B).
"""
from __future__ import annotations

import argparse
import sys

import torch

from specdec_ref.verify import verify_block

from .kit import Column, Subcommand, choice_list, columns, fmt_float, fmt_int, fmt_rate, int_list, load_average, percentile, time_calls

#: Tensors of one grid point (inputs plus the verifier's B x V work buffers) above this are skipped.
MAX_POINT_BYTES = 2 * 1024**3
#: The project's throughput goal for the verifier (k=4, V=16, sampling, no validation, large B).
GOAL_BLOCKS_PER_S = 2e6
GOAL_K, GOAL_VOCAB = 4, 16


VERIFIER_COLUMNS = [
    *columns(device="device", dtype="dtype"),
    Column("threads", "thr", fmt_int),
    Column("mode", "mode"),
    Column("validate", "val", lambda v: "yes" if v else "no"),
    *columns(fmt_int, batch="B", k="k", vocab="V", calls="calls/rep"),
    *columns(fmt_rate, blocks_per_s_median="blocks/s med", blocks_per_s_p10="p10", blocks_per_s_p90="p90"),
    *columns(fmt_float(1), us_per_call_median="us/call med", us_per_call_p10="p10", us_per_call_p90="p90"),
    Column("mean_accepted", "mean m", fmt_float(2)),
    Column("note", "note"),
]


def add_verifier_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int_list, default=[1, 64, 4096, 65536], help="batch sizes B (default 1,64,4096,65536)")
    p.add_argument("--k", type=int_list, default=[1, 4, 8], help="draft lengths k (default 1,4,8)")
    p.add_argument("--vocab", type=int_list, default=[16, 256, 32000], help="vocabulary sizes V (default 16,256,32000)")
    p.add_argument("--threads", type=int_list, default=[1], help="torch intra-op threads, a list is a grid axis (default 1; e.g. 1,2)")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per point (default 7)")
    p.add_argument("--min-seconds", type=float, default=0.2, help="minimum duration of one timed repeat (default 0.2)")
    p.add_argument("--warmup-seconds", type=float, default=0.05, help="warm-up duration per point (default 0.05)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="dtype of the probability tensors")
    p.add_argument("--mode", type=choice_list("sampling", "greedy"), default=["sampling", "greedy"], help="sampling,greedy (default both)")
    p.add_argument(
        "--validate",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="time verify_block(validate=True), which checks the inputs and synchronises with the host (default: --no-validate)",
    )
    p.add_argument("--max-gb", type=float, default=MAX_POINT_BYTES / 1024**3, help="skip points whose tensors exceed this (default 2)")
    p.add_argument("--seed", type=int, default=0)


def point_bytes(batch: int, k: int, vocab: int, mode: str, dtype: torch.dtype) -> int:
    """Input tensors plus the verifier's float32 work buffers (about four B x V rows and the float32 copies)."""
    size = torch.tensor([], dtype=dtype).element_size()
    inputs = batch * (k + 1) * vocab * size + (batch * k * vocab * size if mode == "sampling" else 0)
    upcast = 0 if dtype == torch.float32 else batch * (2 * k + 1) * vocab * 4
    work = 4 * batch * vocab * 4
    return inputs + upcast + work


def make_verifier_inputs(batch: int, k: int, vocab: int, mode: str, dtype: torch.dtype, device: str, seed: int):
    """Softmax rows distinct per (row, position); drafts sampled from the draft rows.

    Built in float32 on the device, then cast; greedy gets draft_probs=None but
    its drafts are still sampled from (unreturned) draft rows.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    # target = draft logits + noise, so the acceptance rate is neither ~0 nor ~1
    draft_logits = 2.0 * torch.randn(batch, k, vocab, generator=gen, device=device)
    target_logits = torch.cat([draft_logits, 2.0 * torch.randn(batch, 1, vocab, generator=gen, device=device)], dim=1)
    target_logits += 1.5 * torch.randn(batch, k + 1, vocab, generator=gen, device=device)
    draft_probs = torch.softmax(draft_logits, dim=-1)
    target_probs = torch.softmax(target_logits, dim=-1)
    del draft_logits, target_logits
    drafts = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=gen).reshape(batch, k)
    target_probs = target_probs.to(dtype)
    draft_probs = draft_probs.to(dtype) if mode == "sampling" else None
    return drafts, draft_probs, target_probs


def run_verifier(args: argparse.Namespace) -> list[dict]:

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("specdec-bench verifier: --device cuda but torch.cuda.is_available() is False")
    dtype = getattr(torch, args.dtype)
    limit = int(args.max_gb * 1024**3)
    rows: list[dict] = []
    original_threads = torch.get_num_threads()
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            for vocab in args.vocab:
                for k in args.k:
                    for batch in args.batch:
                        for mode in args.mode:
                            row = dict(device=device, dtype=args.dtype, threads=threads, mode=mode, validate=args.validate, batch=batch, k=k, vocab=vocab)
                            need = point_bytes(batch, k, vocab, mode, dtype)
                            if need > limit:
                                rows.append(dict(row, note=f"skipped: ~{need / 1024**3:.1f} GB > {args.max_gb:g} GB"))
                                _progress(rows[-1])
                                continue
                            drafts, q, p = make_verifier_inputs(batch, k, vocab, mode, dtype, device, args.seed)
                            gen = torch.Generator(device=device).manual_seed(args.seed + 1)
                            validate = args.validate

                            def call():
                                return verify_block(drafts, q, p, generator=gen, validate=validate)

                            m, _ = call()
                            mean_m = float(m.double().mean())
                            calls, seconds = time_calls(call, device, repeats=args.repeats, min_seconds=args.min_seconds, warmup_seconds=args.warmup_seconds)
                            rates = [batch * calls / s for s in seconds]
                            us = [s / calls * 1e6 for s in seconds]
                            row.update(
                                calls=calls,
                                repeats=len(seconds),
                                blocks_per_s_median=percentile(rates, 50),
                                blocks_per_s_p10=percentile(rates, 10),
                                blocks_per_s_p90=percentile(rates, 90),
                                us_per_call_median=percentile(us, 50),
                                us_per_call_p10=percentile(us, 10),
                                us_per_call_p90=percentile(us, 90),
                                mean_accepted=mean_m,
                                load_average=load_average(),
                                note="",
                            )
                            rows.append(row)
                            _progress(row)
                            del drafts, q, p
    finally:
        torch.set_num_threads(original_threads)
    return rows


def _progress(row: dict) -> None:
    if row.get("blocks_per_s_median") is None:
        msg = row.get("note", "")
    else:
        msg = f"{fmt_rate(row['blocks_per_s_median'])} blocks/s, {row['us_per_call_median']:.1f} us/call"
    print(
        f"  [thr={row['threads']} {row['mode']} B={row['batch']} k={row['k']} V={row['vocab']}] {msg}",
        file=sys.stderr,
        flush=True,
    )


def summarise_verifier(args: argparse.Namespace, rows: list[dict]) -> list[str]:
    goal = [
        r
        for r in rows
        if r["k"] == GOAL_K and r["vocab"] == GOAL_VOCAB and r["mode"] == "sampling" and not r["validate"]
        and r.get("blocks_per_s_median") is not None
    ]
    head = f"goal: >= {fmt_rate(GOAL_BLOCKS_PER_S)} blocks/s at k={GOAL_K}, V={GOAL_VOCAB}, sampling, no validation, large B"
    if not goal:
        return [f"{head}: NOT MEASURED (the grid has no such point; add --k {GOAL_K} --vocab {GOAL_VOCAB} --mode sampling --no-validate)"]
    lines = [head + ":"]
    for threads in sorted({r["threads"] for r in goal}):
        points = [r for r in goal if r["threads"] == threads]
        largest = max(points, key=lambda r: r["batch"])
        fastest = max(points, key=lambda r: r["blocks_per_s_median"])
        rate = largest["blocks_per_s_median"]
        verdict = "REACHED" if rate >= GOAL_BLOCKS_PER_S else "NOT REACHED"
        line = (
            f"  threads={threads} B={largest['batch']} {largest['device']} {largest['dtype']}: median {fmt_rate(rate)} blocks/s "
            f"(p10 {fmt_rate(largest['blocks_per_s_p10'])}, p90 {fmt_rate(largest['blocks_per_s_p90'])}) = "
            f"{rate / GOAL_BLOCKS_PER_S:.2f}x the goal -> {verdict}"
        )
        if fastest is not largest:
            line += f"; fastest B={fastest['batch']}: {fmt_rate(fastest['blocks_per_s_median'])} blocks/s"
        lines.append(line)
    return lines


def verifier_header(args: argparse.Namespace) -> list[str]:
    return [
        f"verify_block, device {args.device}, dtype {args.dtype}, threads {args.threads}, validate={args.validate}, "
        f"{args.repeats} repeats of >= {args.min_seconds:g} s per point (median, p10, p90 over repeats)"
    ]


SUBCOMMAND = Subcommand(
    "verifier",
    "throughput of the reference block verifier (blocks/s) over a B x k x V x mode grid",
    add_verifier_arguments,
    run_verifier,
    VERIFIER_COLUMNS,
    summarise_verifier,
    verifier_header,
)
