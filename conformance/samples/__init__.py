"""Black-box certification: completions produced by ANY engine from a shipped exactly-known checkpoint.

The decoder checks call ``backend.decode``; many engines (a serving stack, a compiled runtime, a
remote endpoint) cannot be wrapped that way. This package judges what they *emit*. Load a shipped
checkpoint (``specdec_ref.exact``: the folder ``exact_model(NAME).path`` loads with
``from_pretrained``; its next-token law is known exactly from tables), generate completions with the
engine, write one JSON object per line, and run::

    python -m conformance.samples --model NAME --temperature T [--top-k K] [--top-k-ties all|lowest-ids]
                                  [--top-p P] [--greedy] [--max-new-tokens N] [--eos] [--length L] FILE.jsonl

(``--tv`` sets the alternative, ``--dtype`` / ``--tolerance`` the greedy flip tolerance, ``--json``
writes the verdict as data; ``--model`` also accepts a pair name, meaning its target)

or call :func:`certify_samples`. Each line holds at least ``prompt_ids`` (list of ints) and
``completion_ids`` (list of ints: the generated ids, prompt excluded); ``seed`` (int, one per
request: two requests of one prompt with the same seed are not independent samples, an input error;
``index``, the sample's position among the ``n`` samples of one request, tells them apart) and
``finish_reason`` (``"stop"`` / ``"eos"`` or ``"length"`` / ``"max_new_tokens"``, or ``"error"`` / ``"abort"``: the
engine ended the request itself, always a violation) and ``text`` (with stop strings) are optional; other keys are
ignored. Mixed prompts are allowed: the completions are grouped per prompt.

What is judged
--------------
*Input* (:class:`SamplesInputError`, naming the line; exit 2): an unreadable file, bad JSON, a line that is not an object,
missing or mistyped fields, an empty prompt, a prompt the model's law is not defined for (too
short, too long for its positions, an order2 prompt not starting with ``<bos>``), ids outside the
vocabulary, an unknown ``finish_reason``, a repeated ``(seed, index)`` for one prompt.

*Impossible tokens* (``NOT CERTIFIED``, never an input error): a generated token the exact law of its context gives
probability 0 (``<bos>`` inside an order2 completion, a token top-k drops) is the engine's failure; each completion's
first one is found at any position, counted (completions, requests, per position) and shown, is an impossible outcome
of its test, and nothing after it is tested; the tests are rerun without them so the report says whether the rest
fits (:attr:`SamplesVerdict.impossible`, the record's ``impossible``).

*Conventions* are declared in the settings (``SamplingConfig.top_k_ties``, ``--top-k-ties``: which tokens top-k keeps
at a tie); a ``NOT CERTIFIED`` file that fits another known convention (:mod:`conformance.samples.conventions`) gains
one ``explained`` line, and its level stays.

*Deterministic invariants* (violations make the verdict ``NOT CERTIFIED``, each with its line):
a completion has exactly ``max_new_tokens`` tokens unless it ends with EOS (with ``--eos``),
nothing follows an EOS, no completion is longer than ``max_new_tokens``, and ``finish_reason``
(when given) agrees with how the completion ends.

*Sampling* (the default): per distinct prompt, the law of the first ``L`` generated tokens
(shorter tuples ending in EOS with ``--eos``) is tested against the exact law from the tables
(:func:`specdec_properties.sequences.continuation_law`) with :func:`specdec_properties.stats.goodness_of_fit`:
it states N, alpha (:data:`specdec_properties.stats.ALPHA` family-wise, split evenly over the prompts),
the alternative (every law at TV >= :data:`SAMPLES_TV` from the exact one), the power against it,
and the smallest TV it detects with power 0.99; on failure, the cells observed vs expected. ``L``
is the largest length (at most ``max_new_tokens`` and :data:`MAX_CELLS` continuations) at which
that prompt's N samples still give the test power 0.99 against :data:`SAMPLES_TV` once the cells
with expected count below 20 are pooled (:func:`choose_length`); with too few samples even for
``L = 1`` it is 1 and the power is what it is. ``--length`` overrides it. Settings whose top-p cut
splits a group of exactly tied logits (:func:`split_ties`) are refused (:class:`AmbiguousLawError`,
exit 2): which tied token survives is implementation-defined, so no law would be fair to every engine.

*Greedy* (``--greedy``): every completion must be the target's greedy continuation token for
token. A position where the engine chose another token is classified as
:mod:`specdec_properties.flips` does: a *numerical flip* when the chosen token's float64 table logit is
within the dtype tolerance (:func:`specdec_properties.flips.tolerance_for` at the row's logit scale over the
tokens of positive probability, ``--dtype``, default float32; or ``--tolerance``, absolute) of the
row maximum -- an exact tie included -- (reported, and the rest of the completion is
checked along the engine's path), else an *algorithmic divergence* (a bug: prompt, position,
expected vs got are printed).

The verdict (same words as the suite's, via :func:`specdec_properties.stats.judge_power`):
``CERTIFIED``; ``CERTIFIED AT REDUCED POWER: detects TV >= x`` (every test passed, some below
power 0.99 against :data:`SAMPLES_TV`); ``NOT CERTIFIED`` (a test failed or an invariant was
broken); ``INCONCLUSIVE`` (a prompt's samples cannot detect even TV 0.5: too few samples). The
printed verdict states N, alpha, the power and the replay command. Exit codes
(:data:`conformance.samples.cli.EXIT_CODES`): 0 for ``CERTIFIED`` and ``CERTIFIED AT REDUCED POWER``, 1 for ``NOT
CERTIFIED`` and ``INCONCLUSIVE``, 2 when the input cannot be judged (input and settings errors, argparse usage errors).

Producing a file with transformers: :func:`generate_with_transformers` (or
``python -m conformance.samples generate --pair NAME ...``) runs ``target.generate(...,
assistant_model=draft, do_sample=True, temperature=..., top_k=..., top_p=...)`` on a shipped pair,
one call per sample, the global RNG seeded per sample (the seed is recorded). See
``docs/black-box.md``.

*Planned looks* (``--looks``: the file given whole; ``--planned-n N``: a growing file planned for N lines; the
``looks`` argument of :func:`certify_samples`): the file is tested on prefixes in its line order, at the main job's
looks (:mod:`conformance.samples.looks`): rejected at the first conclusive look, passed at the first early-pass
look whose statistics rule out the stated alternative, else decided at the full look on 1.07 x N; the verdict
states the lines it read, the looks taken and the whole procedure's power; a file that ends before a look decides
is ``INCONCLUSIVE`` (a partial sample). :class:`conformance.samples.growing.GrowingFile` runs each look once as a
file grows (the engine runner's waves).

Layout (each module imports only those above it; this ``__init__`` only re-exports): ``read`` (parse and
validate the records; deterministic invariants), ``law`` (the exact law, the tested length L, tie splitting),
``conventions`` (the alternative conventions the tool knows), ``generate`` (a file from transformers), ``prompts``
(one prompt's sampling test or greedy walk), ``looks`` (the planned looks), ``verdict`` (:func:`certify_samples`,
:class:`SamplesVerdict`), ``growing`` (:class:`GrowingFile`, a file certified while it grows), ``cli`` (the two command lines). The looks
are measured on the engine matrix's cases by ``python -m conformance.engines.calibration``.
"""
from __future__ import annotations

from ..report import CERTIFIED, NOT_CERTIFIED, REDUCED
from .cli import EXIT_CODES, main
from .conventions import CONVENTIONS, Convention
from .generate import generate_with_transformers
from .law import MAX_CELLS, SAMPLES_TV, AmbiguousLawError, choose_length, split_ties
from .prompts import PromptReport
from .read import FINISH_EOS, FINISH_ERROR, FINISH_LENGTH, SampleRecord, SamplesInputError, invariant_violations, read_records, write_jsonl
from .looks import Looks
from .command import replay_command
from .growing import GrowingFile
from .verdict import INCONCLUSIVE, MAX_POSITION_TESTS, SamplesVerdict, certify_samples

__all__ = [
    "SAMPLES_TV",
    "MAX_CELLS",
    "CERTIFIED",
    "REDUCED",
    "NOT_CERTIFIED",
    "INCONCLUSIVE",
    "SamplesInputError",
    "AmbiguousLawError",
    "split_ties",
    "SampleRecord",
    "PromptReport",
    "SamplesVerdict",
    "read_records",
    "choose_length",
    "certify_samples",
    "Looks",
    "GrowingFile",
    "generate_with_transformers",
    "write_jsonl",
    "replay_command",
    "main",
    "EXIT_CODES",
    "CONVENTIONS",
    "Convention",
]
