"""``specdec-bench``: benchmarks of the reference implementation (a command, not a timed test).

Subcommands (``specdec-bench SUBCOMMAND --help`` for options; also ``python -m specdec_bench SUBCOMMAND``):

* ``verifier`` (:mod:`specdec_bench.verifier`): throughput of :func:`specdec_ref.verify.verify_block` in
  blocks/s over a (B, k, V, mode, threads) grid, median and p10/p90 over repeats.
* ``checks`` (:mod:`specdec_bench.checks`): every registered conformance check case run on a backend without
  pytest, with CPU and wall seconds per case and per shared-sample group, the status, and the
  stated power / N / alpha of the statistical ones.
* ``tree-verifier`` (:mod:`specdec_bench.tree_verifier`): nodes/s of the reference tree verifiers against the chain
  verifier on the same tokens (B = 64, 64-node trees of depth 6, V = 32 000 by default).
* ``tree-decoder`` (:mod:`specdec_bench.tree_decoder`): the tree decoder against the chain decoder and AR on the
  trained pair: tokens/s, tokens per target call, mean accepted length.
* ``decoder`` (:mod:`specdec_bench.decoder`): tokens/s of AR decoding, our speculative decoder (k grid) and
  transformers' assisted generation (pinned to the same k) on the shipped trained pair, greedy and
  sampling, variants interleaved over the repeats; acceptance, calls per token, phase shares,
  token-for-token equality with AR (greedy) and with transformers at the same seed, and the
  ">= 2x transformers' assisted generation" goal verdict.
* ``batch`` (:mod:`specdec_bench.batch`): batched speculative decoding vs batched AR on the same lean static-cache
  forward at B = 1, 8, 64 (k grid, greedy and sampling): tokens/s, tokens per target call, acceptance, the
  measured speedup against Leviathan et al.'s predicted one (measured draft/target cost ratio) and a refined
  prediction, greedy token-for-token equality with AR, and whether transformers' assisted generation runs at B > 1.
* ``profile`` (:mod:`specdec_bench.profile`): does speculation pay, for any backend claiming ``decoder`` (``--backend``):
  paired interleaved AR vs speculative timing with bootstrap intervals, the cost model fitted and checked per k,
  reported phases, breakeven acceptance, a context sweep, memory, the verdict line; JSON, Markdown and plots (``--out``).
* ``profile-engine`` (:mod:`specdec_bench.profile_engine`): the same question for an engine driven through its public API
  (``--engine vllm``: :mod:`specdec_bench.vllm_profile`, run under ``.venv-vllm`` when vLLM is not importable
  here): paired interleaved wall time per request and tokens/s with and without its speculation, bootstrap
  intervals, acceptance from its counters, the verdict line; JSON and Markdown (``--out``).

Adding a subcommand: a module with ``add_X_arguments(parser)``, a ``run_X(args) -> list[dict]``
returning one dict per table row, its column list and (optionally) a ``summarise_X(args, rows) ->
list[str]`` of verdict lines, gathered in a :class:`specdec_bench.kit.Subcommand` named ``SUBCOMMAND``;
then list it in :data:`SUBCOMMANDS`. :func:`main` gives every subcommand the shared ``--json PATH``
output, the environment header and the table printer.

Timings on a shared machine are noisy: every point is a median over repeats,
and the load average (``os.getloadavg()``) is printed before and after.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Sequence

from . import batch, checks, decoder, profile, profile_engine, tree_decoder, tree_verifier, verifier
from .kit import Subcommand, environment, format_table, jsonable, load_average

SUBCOMMANDS: dict[str, Subcommand] = {
    s.name: s
    for s in (
        verifier.SUBCOMMAND, checks.SUBCOMMAND, decoder.SUBCOMMAND, tree_verifier.SUBCOMMAND, tree_decoder.SUBCOMMAND, batch.SUBCOMMAND,
        profile.SUBCOMMAND, profile_engine.SUBCOMMAND,
    )
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec-bench", description=__doc__.split("\n\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", metavar="PATH", default=None, help="also write the rows, summary and environment as JSON")
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for s in SUBCOMMANDS.values():
        p = sub.add_parser(s.name, help=s.help, description=s.help, parents=[common])
        s.add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None, out=None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    sub = SUBCOMMANDS[args.command]
    env = environment()
    load_before = load_average()
    started = time.perf_counter()
    rows = sub.run(args)
    elapsed = time.perf_counter() - started
    load_after = load_average()
    summary = sub.summarise(args, rows)

    print(f"specdec-bench {sub.name}", file=out)
    print(
        f"torch {env['torch']}, python {env['python']}, {env['cpu_count']} CPUs, "
        f"cuda {'available: ' + str(env['cuda_device']) if env['cuda_available'] else 'not available'}",
        file=out,
    )
    print(f"load average (1/5/15 min): before {load_before}, after {load_after}; run took {elapsed:.1f} s", file=out)
    for line in sub.header(args):
        print(line, file=out)
    print(file=out)
    if sub.print_rows:
        sub.print_rows(args, rows, out)
    else:
        print(format_table(rows, sub.columns), file=out)
    if summary:
        print(file=out)
        for line in summary:
            print(line, file=out)

    if args.json:
        payload = {
            "command": sub.name,
            "argv": list(argv) if argv is not None else sys.argv[1:],
            "args": {k: v for k, v in vars(args).items()},
            "environment": env,
            "load_average": {"before": load_before, "after": load_after},
            "seconds": elapsed,
            "rows": rows,
            "summary": summary,
        }
        payload.update(sub.json_extra(rows))
        with open(args.json, "w") as fh:
            json.dump(jsonable(payload), fh, indent=2)
        print(f"wrote {args.json}", file=out)
    return sub.exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())