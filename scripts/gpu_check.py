#!/usr/bin/env python
"""The device-dependent checks of specdec-ref on a CUDA machine, in one summary table.

Rows (``check | device | dtype | result | seconds | detail``), each PASS or FAIL:

* ``conformance verifier``: ``python -m pytest conformance/test_verifier.py --specdec-device=cuda -n 0 -q
  -p no:cacheprovider`` (the backend under test is ``$SPECDEC_BACKEND``, default the reference); passed,
  skipped and failed counts from its certificate. PASS: pytest exit 0, no failure or error, at least one pass.
* ``verifier throughput``: ``specdec-bench verifier --device cuda`` (``python -m specdec_bench verifier``) at
  B=64, k=8, V=32000, sampling, no validation; median over repeats, each timed with a device
  synchronisation (:func:`specdec_bench.kit.time_calls`). Emitted tokens/s = blocks/s x (1 + mean accepted).
  PASS: the benchmark ran and measured a rate (there is no throughput goal at this point).
* ``decoder greedy vs AR`` (float32 and bfloat16): a tiny Llama pair (``tiny_lm('llama', init_scale=2.0)``
  and ``make_draft(target, 'noisy', seed=12, noise=0.05)``) on the device, greedy
  ``speculative_decode`` against ``autoregressive_decode`` on the same device and dtype, over several
  prompts. float32: every decode identical. bfloat16: the first divergence of each decode is classified
  by :func:`specdec_properties.flips.classify_sequences`; a *numerical flip* (both tokens within the bfloat16
  tolerance of the float64 top logit: a near-tie that rounding may break either way) is reported as
  "N flips / M decodes"; any other divergence fails.

* ``proposers`` (float32 and bfloat16): the exactly-known order-1 pair's target on the device with each proposer
  (prompt lookup, the exact EAGLE head, the exact Medusa heads; :mod:`specdec_ref.exact.heads`): greedy decoding
  equals AR (the tables are exact in both dtypes, so no flip is tolerated), and sampled rows (seeded, prompts of 1
  to 4 tokens, heads drawing their drafts) decode bit for bit the same alone and in one batch. The detail gives the
  greedy acceptance per proposer.

``--dry-run`` (or ``GPU_CHECK_DRY_RUN=1``): the same rows on the CPU with tiny sizes (a fast subset of
the verifier checks, a tiny benchmark point, a few short decodes), no CUDA needed, well under a minute.
Without it and without CUDA: exit 2 with a one-line message. Exit 0 when every row passed, else 1.
Progress goes to stderr, the table to stdout (``--json PATH`` also writes the rows).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python scripts/gpu_check.py` imports this checkout's packages
    sys.path.insert(0, str(ROOT))

COLUMNS = ("check", "device", "dtype", "result", "seconds", "detail")
PASS, FAIL = "PASS", "FAIL"
#: Row names, in table order (tests/test_gpu_check.py asserts every one is printed).
CHECKS = ("conformance verifier", "verifier throughput", "decoder greedy vs AR", "proposers")
DRY_RUN_ENV = "GPU_CHECK_DRY_RUN"
NO_CUDA_MESSAGE = (
    "gpu_check: CUDA is not available (torch.cuda.is_available() is False); run it on a CUDA machine, "
    "or pass --dry-run (GPU_CHECK_DRY_RUN=1) for the CPU dry run"
)
#: Environment variables of an enclosing pytest run that must not leak into the child pytest / bench runs.
CHILD_ENV_DROP = ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_CURRENT_TEST")


@dataclass
class Row:
    check: str
    device: str
    dtype: str
    result: str
    seconds: float
    detail: str


@dataclass(frozen=True)
class Plan:
    """Sizes of one run: the CUDA check (:data:`GPU`) or the CPU dry run (:data:`DRY`)."""

    device: str
    #: extra pytest arguments (the dry run selects a fast subset) and the run's time limit
    conformance_args: tuple[str, ...]
    conformance_timeout: float
    #: one benchmark point and its timing
    bench_batch: int
    bench_k: int
    bench_vocab: int
    bench_repeats: int
    bench_min_seconds: float
    bench_timeout: float
    #: the tiny Llama pair and the decodes
    vocab: int
    hidden: int
    layers: int
    prompts: int
    prompt_len: int
    new_tokens: int
    k: int
    seed: int = 3


GPU = Plan(
    device="cuda",
    conformance_args=(),
    conformance_timeout=330.0,
    bench_batch=64,
    bench_k=8,
    bench_vocab=32000,
    bench_repeats=7,
    bench_min_seconds=0.2,
    bench_timeout=120.0,
    vocab=256,
    hidden=64,
    layers=2,
    prompts=24,
    prompt_len=8,
    new_tokens=64,
    k=4,
)
DRY = Plan(
    device="cpu",
    conformance_args=("-k", "structure_greedy or sampling_seeded_reproducible"),
    conformance_timeout=120.0,
    bench_batch=4,
    bench_k=2,
    bench_vocab=16,
    bench_repeats=3,
    bench_min_seconds=0.01,
    bench_timeout=120.0,
    vocab=32,
    hidden=32,
    layers=2,
    prompts=8,
    prompt_len=4,
    new_tokens=24,
    k=3,
)


def progress(message: str) -> None:
    print(f"[gpu_check] {message}", file=sys.stderr, flush=True)


def one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def child_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in CHILD_ENV_DROP}, **extra}


def run_child(cmd: list[str], timeout: float, **env: str) -> tuple[int | None, str]:
    """Run ``cmd`` from the repository root with ``env`` added; ``(exit code or None on timeout, stdout + stderr)``."""
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=child_env(**env), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return None, out
    return proc.returncode, proc.stdout + proc.stderr


def last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


# ----------------------------------------------------------------------------- rows


def conformance_row(plan: Plan) -> Row:
    """The verifier conformance checks with ``--specdec-device``; counts from the certificate."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "verifier.json"
        cmd = [
            sys.executable, "-m", "pytest", "conformance/test_verifier.py", f"--specdec-device={plan.device}",
            "-n", "0", "-q", "-p", "no:cacheprovider", f"--specdec-report={report}", *plan.conformance_args,
        ]
        # one torch thread, as the plugin gives every xdist worker: the checks' CPU side is many small ops, which
        # more OpenMP threads make several times slower (135 s against 18 s for one scenario on 2 cores)
        code, output = run_child(cmd, plan.conformance_timeout, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        cert = json.loads(report.read_text()) if report.exists() else None
    seconds = time.perf_counter() - started
    row = Row(CHECKS[0], plan.device, "float32", FAIL, seconds, "")
    if code is None:
        row.detail = f"timed out after {plan.conformance_timeout:g} s: {one_line(last_line(output))}"
        return row
    if cert is None:
        row.detail = f"pytest exit {code}, no certificate: {one_line(last_line(output))}"
        return row
    t = cert["totals"]
    bad = t["failed"] + t["error"] + t["inconclusive"]
    row.detail = (
        f"{t['passed']} passed, {t['skipped']} skipped, {t['failed']} failed, {t['error']} errors"
        + (f", {t['inconclusive']} inconclusive" if t["inconclusive"] else "")
        + f" (pytest exit {code}; {cert['verdict']['headline']})"
    )
    if code == 0 and bad == 0 and t["passed"] > 0:
        row.result = PASS
    elif t["passed"] == 0 and not bad:
        row.detail += ": no check ran"
    return row


def bench_row(plan: Plan) -> Row:
    """``specdec-bench verifier`` at one point on the device; emitted tokens/s = blocks/s x (1 + mean accepted)."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [
            sys.executable, "-m", "specdec_bench", "verifier", "--device", plan.device, "--dtype", "float32",
            "--batch", str(plan.bench_batch), "--k", str(plan.bench_k), "--vocab", str(plan.bench_vocab),
            "--mode", "sampling", "--no-validate", "--repeats", str(plan.bench_repeats),
            "--min-seconds", str(plan.bench_min_seconds), "--warmup-seconds", str(min(0.05, plan.bench_min_seconds)),
            "--json", str(out),
        ]
        code, output = run_child(cmd, plan.bench_timeout)
        payload = json.loads(out.read_text()) if out.exists() else None
    seconds = time.perf_counter() - started
    point = f"B={plan.bench_batch} k={plan.bench_k} V={plan.bench_vocab} sampling"
    row = Row(CHECKS[1], plan.device, "float32", FAIL, seconds, "")
    if code is None:
        row.detail = f"timed out after {plan.bench_timeout:g} s ({point})"
        return row
    rows = (payload or {}).get("rows") or []
    rate = rows[0].get("blocks_per_s_median") if rows else None
    if code != 0 or not rate:
        row.detail = f"specdec-bench exit {code}, no rate ({point}): {one_line(last_line(output))}"
        return row
    mean_m = float(rows[0].get("mean_accepted") or 0.0)
    tokens = rate * (1.0 + mean_m)
    row.result = PASS
    row.detail = (
        f"{tokens:.3g} tokens/s = {rate:.3g} blocks/s x (1 + mean accepted {mean_m:.2f}); "
        f"{point}, median of {rows[0].get('repeats', plan.bench_repeats)}, {rows[0].get('us_per_call_median', 0):.1f} us/call"
    )
    return row


def tiny_pair(plan: Plan):
    from specdec_ref.models import make_draft, tiny_lm

    target = tiny_lm(
        "llama", vocab_size=plan.vocab, hidden_size=plan.hidden, num_layers=plan.layers, seed=plan.seed, init_scale=2.0
    )
    return target, make_draft(target, "noisy", seed=12, noise=0.05)


def decoder_rows(plan: Plan) -> list[Row]:
    """Greedy speculative decoding against AR on the device, in float32 (identical) and bfloat16 (flips only)."""
    import torch

    torch.set_float32_matmul_precision("highest")  # no TF32: "float32" must mean float32 here
    threads = torch.get_num_threads()
    if plan.device == "cpu":
        torch.set_num_threads(1)  # tiny models on the CPU: more intra-op threads only add barrier costs (tests/conftest.py)
    try:
        return compare_decoders(plan)
    finally:
        torch.set_num_threads(threads)


def compare_decoders(plan: Plan) -> list[Row]:
    import copy

    import torch

    from specdec_properties.flips import classify_sequences
    from specdec_ref.decode import autoregressive_decode, speculative_decode

    target, draft = tiny_pair(plan)
    prompts = torch.randint(0, plan.vocab, (plan.prompts, plan.prompt_len), generator=torch.Generator().manual_seed(plan.seed))
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        progress(f"decoder: {plan.prompts} greedy decodes of {plan.new_tokens} tokens, {name} on {plan.device}")
        started = time.perf_counter()
        row = Row(CHECKS[2], plan.device, name, FAIL, 0.0, "")
        try:
            t = copy.deepcopy(target).to(device=plan.device, dtype=dtype)
            d = copy.deepcopy(draft).to(device=plan.device, dtype=dtype)
            verdicts = []
            with torch.no_grad():
                for i in range(plan.prompts):
                    prompt = prompts[i : i + 1]
                    spec = speculative_decode(t, d, prompt, k=plan.k, max_new_tokens=plan.new_tokens)
                    ar = autoregressive_decode(t, prompt, max_new_tokens=plan.new_tokens)
                    if spec.tokens != ar.tokens:
                        verdicts.append(classify_sequences(t, prompt, spec.tokens, ar.tokens, dtype_under_test=dtype))
            flips = sum(v.is_numerical_flip for v in verdicts)
            bugs = [v for v in verdicts if v.is_bug]
            m = plan.prompts
            if dtype == torch.float32:
                row.result = PASS if not verdicts else FAIL
                row.detail = f"{m - len(verdicts)}/{m} decodes identical to AR ({plan.new_tokens} tokens, k={plan.k})"
                if verdicts:
                    row.detail += f"; {len(verdicts)} diverge ({flips} within the float32 flip tolerance): {one_line(verdicts[0].describe(), 120)}"
            else:
                row.result = PASS if not bugs else FAIL
                row.detail = f"{flips} flips / {m} decodes ({plan.new_tokens} tokens, k={plan.k})"
                if bugs:
                    row.detail += f"; {len(bugs)} non-flip divergences: {one_line(bugs[0].describe(), 120)}"
        except Exception as exc:  # a crash is a failed row, never a lost table (its traceback goes to stderr)
            progress(traceback.format_exc())
            row.detail = one_line(f"error: {type(exc).__name__}: {exc}")
        row.seconds = time.perf_counter() - started
        rows.append(row)
    return rows


def proposer_rows(plan: Plan) -> list[Row]:
    """Each proposer on the device: greedy equals AR, seeded sampled rows reproduce alone (module docstring)."""
    import torch

    threads = torch.get_num_threads()
    if plan.device == "cpu":
        torch.set_num_threads(1)
    try:
        return compare_proposers(plan)
    finally:
        torch.set_num_threads(threads)


def compare_proposers(plan: Plan) -> list[Row]:
    import copy

    import torch

    from specdec_ref.contract import Request
    from specdec_ref.decode import SpeculativeDecoder, autoregressive_decode
    from specdec_ref.exact.deep import deep_target
    from specdec_ref.exact.heads import exact_eagle3_head, exact_eagle_head, exact_medusa_heads, exact_mtp_head
    from specdec_ref.exact import exact_model
    from specdec_ref.proposers import Ngram
    from specdec_ref.warp import SamplingConfig

    rows = []
    dec = SpeculativeDecoder()
    prompts = [[3], [1, 2, 1, 2], [5, 0, 5, 0, 5], [6, 4], [0, 1, 0, 1, 0, 1], [2, 2, 2]][: max(2, plan.prompts // 4)]
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        progress(f"proposers: greedy and sampled decodes with prompt lookup, EAGLE, EAGLE-3, MTP and Medusa, {name} on "
                 f"{plan.device}")
        started = time.perf_counter()
        row = Row(CHECKS[3], plan.device, name, FAIL, 0.0, "")
        try:
            target = copy.deepcopy(exact_model("order1-target").load(dtype)).to(plan.device)
            deep = copy.deepcopy(deep_target("order1-target", dtype=dtype)).to(plan.device)
            specs = {"ngram": Ngram(1, 3), "eagle": exact_eagle_head(target, "order1-target", sample=False),
                     "eagle3": exact_eagle3_head(deep, "order1-target", sample=False),
                     "mtp": exact_mtp_head(target, "order1-target", sample=False),
                     "medusa": exact_medusa_heads(target, "order1-target", heads=3)}
            sampled = {"eagle": exact_eagle_head(target, "order1-target", sample=True),
                       "eagle3": exact_eagle3_head(deep, "order1-target", sample=True),
                       "mtp": exact_mtp_head(target, "order1-target", sample=True),
                       "medusa": exact_medusa_heads(target, "order1-target", heads=3, sample=True), "ngram": specs["ngram"]}
            problems, rates = [], []
            with torch.no_grad():
                for kind, spec in specs.items():
                    model = deep if kind == "eagle3" else target
                    accepted = proposed = 0
                    for prompt in prompts:
                        p = torch.tensor([prompt], device=plan.device)
                        ar = autoregressive_decode(model, p, max_new_tokens=plan.new_tokens)
                        res = dec.decode(model, spec, p, k=3, max_new_tokens=plan.new_tokens)
                        accepted += sum(r.accepted for r in res.rounds)
                        proposed += sum(r.proposed for r in res.rounds)
                        if res.tokens != ar.tokens:
                            problems.append(f"{kind} greedy != AR for prompt {prompt}")
                    rates.append(f"{kind} {accepted}/{proposed}")
                    reqs = [Request(prompt=prompts[i % len(prompts)][: 1 + i % 4], max_new_tokens=16,
                                    sampling=SamplingConfig(temperature=1.0), seed=i) for i in range(8)]
                    together = [r.tokens for r in dec.decode_batch(model, sampled[kind], reqs, k=3)]
                    alone = [dec.decode_batch(model, sampled[kind], [r], k=3)[0].tokens for r in reqs]
                    if together != alone:
                        problems.append(f"{kind} sampled: a seeded row differs alone and in the batch")
            row.result = PASS if not problems else FAIL
            row.detail = one_line("; ".join(problems) if problems else
                                  f"greedy == AR for {len(prompts)} prompts each, rows reproduce alone; accepted drafts: "
                                  + ", ".join(rates))
        except Exception as exc:  # a crash is a failed row, never a lost table (its traceback goes to stderr)
            progress(traceback.format_exc())
            row.detail = one_line(f"error: {type(exc).__name__}: {exc}")
        row.seconds = time.perf_counter() - started
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- driver


def format_table(rows: list[Row]) -> str:
    cells = [list(COLUMNS)] + [[r.check, r.device, r.dtype, r.result, f"{r.seconds:.1f}", r.detail] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    right = {COLUMNS.index("seconds")}

    def line(values):
        return " | ".join(v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(c) for c in cells[1:])])


def env_dry_run() -> bool:
    return os.environ.get(DRY_RUN_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dry-run", action="store_true", default=env_dry_run(),
        help=f"run every row on the CPU with tiny sizes, no CUDA needed (also ${DRY_RUN_ENV}=1)",
    )
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the rows as JSON")
    return parser.parse_args(argv)


def run(plan: Plan) -> list[Row]:
    steps = [
        (f"conformance verifier checks on {plan.device} (pytest, up to {plan.conformance_timeout:g} s)", lambda: [conformance_row(plan)]),
        (f"verifier throughput on {plan.device} (specdec-bench verifier)", lambda: [bench_row(plan)]),
        (f"reference decoder on {plan.device}", lambda: decoder_rows(plan)),
        (f"proposers on {plan.device}", lambda: proposer_rows(plan)),
    ]
    rows: list[Row] = []
    for (what, step), check in zip(steps, CHECKS):
        progress(what)
        started = time.perf_counter()
        try:
            rows.extend(step())
        except Exception as exc:  # a crash is a failed row, never a lost table
            rows.append(Row(check, plan.device, "-", FAIL, time.perf_counter() - started, one_line(f"error: {type(exc).__name__}: {exc}")))
        progress(f"  {rows[-1].result} in {time.perf_counter() - started:.1f} s")
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(NO_CUDA_MESSAGE, file=sys.stderr)
        return 2
    plan = DRY if args.dry_run else GPU
    started = time.perf_counter()
    rows = run(plan)
    total = time.perf_counter() - started
    where = "CPU dry run (tiny sizes)" if args.dry_run else f"CUDA: {torch.cuda.get_device_name()}"
    print(f"gpu_check: {where}; torch {torch.__version__}; {total:.1f} s")
    print(format_table(rows))
    failed = [r for r in rows if r.result != PASS]
    print(f"gpu_check: {len(rows) - len(failed)}/{len(rows)} rows passed" + (f"; FAILED: {', '.join(f'{r.check} ({r.dtype})' for r in failed)}" if failed else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"dry_run": args.dry_run, "seconds": total, "rows": [asdict(r) for r in rows]}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
