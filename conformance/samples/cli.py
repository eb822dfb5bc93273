"""The command lines: ``python -m conformance.samples FILE.jsonl ...`` certifies a file, ``... generate OUT.jsonl ...`` writes one.

Exit codes (:data:`EXIT_CODES`), so that a CI gate tells misuse from a failing engine: 0 for ``CERTIFIED`` and
``CERTIFIED AT REDUCED POWER``; 1 for ``NOT CERTIFIED`` and ``INCONCLUSIVE`` (the engine's output fails, impossible
tokens included, or is too little to judge); 2 when the file or the invocation cannot be judged at all: ``INPUT
ERROR`` (unreadable file, bad JSON, missing fields, ids outside the vocabulary, an invalid prompt, a bad option
value) or ``SETTINGS ERROR`` (settings that leave the exact law undetermined) on stderr, and argparse usage errors.
"""
from __future__ import annotations

import argparse
import json
import sys

from specdec_ref.warp import SamplingConfig

from ..report import NOT_CERTIFIED
from .conventions import TOP_K_TIES_CLI
from .generate import generate_with_transformers
from .law import _EXTRA_SETTINGS, SAMPLES_TV, AmbiguousLawError
from .looks import Looks
from .read import SamplesInputError, write_jsonl
from .verdict import INCONCLUSIVE, certify_samples


#: The exit codes of ``python -m conformance.samples`` (also in its ``--help``).
EXIT_CODES = {
    0: "CERTIFIED or CERTIFIED AT REDUCED POWER",
    1: "NOT CERTIFIED (a test failed, a token of probability 0, an invariant broken) or INCONCLUSIVE (too few samples, no "
       "position after the first)",
    2: "the input cannot be judged: INPUT ERROR (unreadable file, bad JSON, missing fields, an id outside the vocabulary, "
       "an invalid prompt, a bad option value), SETTINGS ERROR (the settings leave the exact law undetermined), or a usage error",
}
EXIT_INPUT = 2
_TIES_FROM_CLI = {cli: rule for rule, cli in TOP_K_TIES_CLI.items()}


def _sampling_from_args(args) -> SamplingConfig:
    extra = {name: getattr(args, name) for _, name, _, _ in _EXTRA_SETTINGS if hasattr(args, name)}
    if args.greedy:
        return SamplingConfig(greedy=True, **{k: v for k, v in extra.items() if k != "min_p"})
    ties = _TIES_FROM_CLI[getattr(args, "top_k_ties", "all")]
    return SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, top_k_ties=ties, **extra)


def _flag_type(kind):
    """``kind`` for argparse: its ValueError's own message in the usage error (not "invalid <function> value")."""
    def parse(text: str):
        try:
            return kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = kind.__name__
    return parse


def _add_extra_setting_args(parser: argparse.ArgumentParser) -> None:
    for flag, name, kind, off in _EXTRA_SETTINGS:
        help = (f"the engine's {name}, TOKEN:BIAS[,TOKEN:BIAS...] (default: none)" if name == "logit_bias" else
                'the engine\'s constraint (grammar, regex, choice) as a token automaton, JSON {"transitions": [[next '
                'state or -1 per token id] per state], "start": 0} (default: none)' if name == "constraint"
                else "the engine's bad words as token ids, a word's ids separated by spaces, words by ';' (\"3 1;5\": "
                "t1 never right after a generated t3, t5 never; the prompt is not read) (default: none)"
                if name == "bad_words" else f"the engine's {name} (default: off)")
        parser.add_argument(flag, dest=name, type=_flag_type(kind), default=off, help=help)


def _add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1)")
    parser.add_argument("--top-k", type=int, default=None, help="top-k (default: none)")
    parser.add_argument("--top-p", type=float, default=None, help="top-p (default: none)")
    parser.add_argument("--greedy", action="store_true", help="greedy decoding: compare with the greedy continuation")
    parser.add_argument("--max-new-tokens", type=int, default=4, help="the engine's max_new_tokens (default 4)")
    parser.add_argument("--eos", action="store_true", help="the engine stopped at the model's EOS token")
    parser.add_argument("--pool-prompts", action="store_true",
                        help="test the completions of distinct prompts that end in one table cell together (their law "
                             "is one): a file of many distinct prompts, each seen a few times")


def _certify_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.samples",
        description="Certify completions of a shipped exactly-known checkpoint produced by any engine "
        "(subcommand `generate` produces such a file with transformers).",
        epilog="exit codes: " + "; ".join(f"{code}: {what}" for code, what in EXIT_CODES.items()),
    )
    parser.add_argument("file", help="JSONL: one object per line with prompt_ids, completion_ids (and optional seed, finish_reason)")
    parser.add_argument("--model", required=True, help="the exact model the completions come from (e.g. order1-target) or a pair name")
    _add_sampling_args(parser)
    parser.add_argument(
        "--top-k-ties", choices=tuple(TOP_K_TIES_CLI.values()), default="all",
        help="the engine's top-k tie rule: 'all' keeps every token tied with the k-th largest logit (Hugging Face, vLLM; "
        "the default), 'lowest-ids' keeps exactly k, ties broken by the smallest id",
    )
    _add_extra_setting_args(parser)
    parser.add_argument("--stop", action="append", default=None, metavar="STRING",
                        help="a stop string the engine was given (repeatable; write --stop=' t1' for one that starts "
                        "with a space): a completion also ends at the token that completes one, and a line's 'text' "
                        "must be its tokens' rendering cut before it")
    parser.add_argument("--token-prefix", default="", metavar="TEXT",
                        help="with --stop: what the engine's text puts before every token's name (vLLM's detokenizer "
                        "on the exactly-known vocabulary: --token-prefix=' '; llama.cpp: nothing, the default)")
    parser.add_argument("--length", type=int, default=None, help="L, the number of first tokens whose law is tested (default: chosen from N)")
    parser.add_argument("--tv", type=float, default=SAMPLES_TV, help=f"the alternative the power is stated against (default {SAMPLES_TV})")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="greedy: the dtype the engine ran in (flip tolerance)")
    parser.add_argument("--tolerance", type=float, default=None, help="greedy: absolute logit tolerance of a numerical flip (overrides --dtype)")
    looks = parser.add_mutually_exclusive_group()
    looks.add_argument("--looks", action="store_true", help="test at planned looks on prefixes of the file in its line "
                       "order (the main job's interim and early-pass looks), the whole file being the full look: the "
                       "verdict says on how many lines it was decided")
    looks.add_argument("--planned-n", type=float, default=None, help="a growing file: the nominal N its looks are "
                       "planned for (the full look reads 1.07 x N lines); a file that ends before a look decides is "
                       "INCONCLUSIVE, stating the lines the next look needs")
    parser.add_argument("--json", default=None, help="also write the verdict as JSON to this path")
    args = parser.parse_args(argv)
    try:
        sampling = _sampling_from_args(args)
        stop = None
        if args.stop is not None or args.token_prefix:
            from specdec_properties.stops import StopStrings

            from .read import _resolve_model

            stop = StopStrings.for_model(_resolve_model(args.model), tuple(args.stop or ()), args.token_prefix)
        verdict = certify_samples(
            args.file, model=args.model, sampling=sampling, max_new_tokens=args.max_new_tokens,
            eos_id=True if args.eos else None, length=args.length, tv=args.tv, dtype=args.dtype, tolerance=args.tolerance,
            looks=Looks(args.planned_n) if args.planned_n else bool(args.looks), stop=stop,
            pool_prompts=args.pool_prompts,
        )
    except SamplesInputError as exc:
        print(f"INPUT ERROR: {exc}", file=sys.stderr)
        print(f"{NOT_CERTIFIED}: the completions could not be read", file=sys.stdout)
        return EXIT_INPUT
    except AmbiguousLawError as exc:
        print(f"SETTINGS ERROR: {exc}", file=sys.stderr)
        print(f"{INCONCLUSIVE}: the exact law is not defined by these settings", file=sys.stdout)
        return EXIT_INPUT
    except ValueError as exc:
        print(f"INPUT ERROR: {exc}", file=sys.stderr)
        return EXIT_INPUT
    print(verdict.report())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(verdict.as_record(), fh, indent=2)
    return verdict.exit_code


def _generate_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.samples generate",
        description="Write n completions per prompt from transformers generate(assistant_model=draft) on a shipped pair.",
    )
    parser.add_argument("out", help="the JSONL file to write")
    parser.add_argument("--pair", required=True, help="a shipped exact pair (e.g. order1-close)")
    parser.add_argument("--prompt", action="append", required=True, help="prompt ids, space separated (repeatable)")
    parser.add_argument("--n", type=int, required=True, help="samples per prompt")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first sample (sample i gets seed + i)")
    parser.add_argument("--no-assistant", action="store_true", help="plain generate, no draft")
    parser.add_argument("--num-assistant-tokens", type=int, default=None, help="pin the draft length (default: transformers' schedule)")
    _add_sampling_args(parser)
    args = parser.parse_args(argv)
    prompts = [[int(x) for x in p.replace(",", " ").split()] for p in args.prompt]
    records = generate_with_transformers(
        args.pair, prompts, args.n, _sampling_from_args(args), args.max_new_tokens, args.seed,
        eos=args.eos, assisted=not args.no_assistant, num_assistant_tokens=args.num_assistant_tokens,
    )
    write_jsonl(args.out, records)
    print(f"wrote {len(records)} completions to {args.out} ({records[0]['engine']})")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "generate":
        return _generate_main(argv[1:])
    return _certify_main(argv)
