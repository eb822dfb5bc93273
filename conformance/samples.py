"""Black-box certification: completions produced by ANY engine from a shipped exactly-known checkpoint.

The decoder checks call ``backend.decode``; many engines (a serving stack, a compiled runtime, a
remote endpoint) cannot be wrapped that way. This module judges what they *emit*. Load a shipped
checkpoint (``specdec_ref.exact_models``: the folder ``exact_model(NAME).path`` loads with
``from_pretrained``; its next-token law is known exactly from tables), generate completions with the
engine, write one JSON object per line, and run::

    python -m conformance.samples --model NAME --temperature T [--top-k K] [--top-p P]
                                  [--greedy] [--max-new-tokens N] [--eos] [--length L] FILE.jsonl

(``--tv`` sets the alternative, ``--dtype`` / ``--tolerance`` the greedy flip tolerance, ``--json``
writes the verdict as data; ``--model`` also accepts a pair name, meaning its target)

or call :func:`certify_samples`. Each line holds at least ``prompt_ids`` (list of ints) and
``completion_ids`` (list of ints: the generated ids, prompt excluded); ``seed`` (int, one per
request: two requests of one prompt with the same seed are not independent samples, an input error;
``index``, the sample's position among the ``n`` samples of one request, tells them apart) and
``finish_reason`` (``"stop"`` / ``"eos"`` or ``"length"`` / ``"max_new_tokens"``) are optional;
other keys are ignored. Mixed prompts are allowed: the completions are grouped per prompt.

What is judged
--------------
*Input* (:class:`SamplesInputError`, naming the line): bad JSON, a line that is not an object,
missing or mistyped fields, an empty prompt, a prompt the model's law is not defined for (too
short, too long for its positions, an order2 prompt not starting with ``<bos>``), ids outside the
vocabulary, an unknown ``finish_reason``, a repeated ``(seed, index)`` for one prompt.

*Deterministic invariants* (violations make the verdict ``NOT CERTIFIED``, each with its line):
a completion has exactly ``max_new_tokens`` tokens unless it ends with EOS (with ``--eos``),
nothing follows an EOS, no completion is longer than ``max_new_tokens``, and ``finish_reason``
(when given) agrees with how the completion ends.

*Sampling* (the default): per distinct prompt, the law of the first ``L`` generated tokens
(shorter tuples ending in EOS with ``--eos``) is tested against the exact law from the tables
(:func:`properties.sequences.continuation_law`) with :func:`properties.stats.goodness_of_fit`:
it states N, alpha (:data:`properties.stats.ALPHA` family-wise, split evenly over the prompts),
the alternative (every law at TV >= :data:`SAMPLES_TV` from the exact one), the power against it,
and the smallest TV it detects with power 0.99; on failure, the cells observed vs expected. ``L``
is the largest length (at most ``max_new_tokens`` and :data:`MAX_CELLS` continuations) at which
that prompt's N samples still give the test power 0.99 against :data:`SAMPLES_TV` once the cells
with expected count below 20 are pooled (:func:`choose_length`); with too few samples even for
``L = 1`` it is 1 and the power is what it is. ``--length`` overrides it. Settings whose top-p cut
splits a group of exactly tied logits (:func:`split_ties`) are refused (:class:`AmbiguousLawError`,
exit 1): which tied token survives is implementation-defined, so no law would be fair to every engine.

*Greedy* (``--greedy``): every completion must be the target's greedy continuation token for
token. A position where the engine chose another token is classified as
:mod:`properties.flips` does: a *numerical flip* when the chosen token's float64 table logit is
within the dtype tolerance (:func:`properties.flips.tolerance_for` at the row's logit scale over the
tokens of positive probability, ``--dtype``, default float32; or ``--tolerance``, absolute) of the
row maximum -- an exact tie included -- (reported, and the rest of the completion is
checked along the engine's path), else an *algorithmic divergence* (a bug: prompt, position,
expected vs got are printed).

The verdict (same words as the suite's, via :func:`properties.stats.judge_power`):
``CERTIFIED``; ``CERTIFIED AT REDUCED POWER: detects TV >= x`` (every test passed, some below
power 0.99 against :data:`SAMPLES_TV`); ``NOT CERTIFIED`` (a test failed or an invariant was
broken); ``INCONCLUSIVE`` (a prompt's samples cannot detect even TV 0.5: too few samples). The
printed verdict states N, alpha, the power and the replay command. Exit code: 0 for ``CERTIFIED``
and ``CERTIFIED AT REDUCED POWER``, 1 otherwise (input and settings errors included; argparse usage
errors exit 2).

Producing a file with transformers: :func:`generate_with_transformers` (or
``python -m conformance.samples generate --pair NAME ...``) runs ``target.generate(...,
assistant_model=draft, do_sample=True, temperature=..., top_k=..., top_p=...)`` on a shipped pair,
one call per sample, the global RNG seeded per sample (the seed is recorded). See
``docs/black-box.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import torch

from properties.transitions import FIRST_TESTED_POSITION, count_transitions, transition_test
from properties.flips import ALGORITHMIC_DIVERGENCE, NUMERICAL_FLIP, FlipVerdict, tolerance_for
from properties.sequences import continuation_law, law_to_cells, next_logits64
from properties.stats import (
    ALPHA,
    MIN_EXPECTED,
    TARGET_POWER,
    FitResult,
    goodness_of_fit,
    judge_power,
    power_against_tv,
)
from specdec_ref.warp import GREEDY, SamplingConfig

from .report import CERTIFIED, NOT_CERTIFIED, REDUCED

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
    "generate_with_transformers",
    "write_jsonl",
    "replay_command",
    "main",
]

#: The alternative the black-box sampling test states its power against (the decoder-level goal).
SAMPLES_TV = 0.03
#: Largest number of continuations a law may have for :func:`choose_length` to go to that length.
MAX_CELLS = 4096
#: Positions after the first up to this one get a transition test each (all of them are in the pooled test).
MAX_POSITION_TESTS = 16

INCONCLUSIVE = "INCONCLUSIVE"  # CERTIFIED, REDUCED and NOT_CERTIFIED are the suite's own words (conformance.report)

FINISH_EOS = ("stop", "eos")
FINISH_LENGTH = ("length", "max_new_tokens")


class SamplesInputError(ValueError):
    """The completions file (or records) is malformed; the message names the line."""


class AmbiguousLawError(ValueError):
    """The settings make the exact law depend on how a sampler sorts tied logits (:func:`split_ties`)."""


# ----------------------------------------------------------------------------- the model


def _resolve_model(model):
    """An exact model (by name, or a pair name: its target), or the object itself (ExactModel / torch module)."""
    if isinstance(model, str):
        from specdec_ref import exact_models

        if model in exact_models.EXACT_MODELS:
            return exact_models.exact_model(model)
        if model in exact_models.EXACT_PAIRS:
            return exact_models.exact_pair(model).target
        raise SamplesInputError(
            f"unknown model {model!r}; shipped exact models: {', '.join(sorted(exact_models.EXACT_MODELS))} "
            f"(or a pair: {', '.join(sorted(exact_models.EXACT_PAIRS))})"
        )
    return model


def _model_name(model) -> str:
    name = getattr(model, "name", None)
    if isinstance(name, str):
        return name
    recipe = getattr(model, "specdec_recipe", None)
    return f"{type(model).__name__}" + (f"({recipe.get('arch', '')})" if isinstance(recipe, dict) else "")


def _vocab(model) -> int:
    if hasattr(model, "next_logits") and hasattr(model, "vocab"):
        return int(model.vocab)
    from specdec_ref.models import model_dims

    return int(model_dims(model)["vocab_size"])


def _max_positions(model) -> int | None:
    if hasattr(model, "next_logits"):
        value = getattr(model, "max_positions", None)
        return int(value) if value else None
    from specdec_ref.models import model_dims

    return model_dims(model)["max_positions"] or None


# ----------------------------------------------------------------------------- input


@dataclass(frozen=True)
class SampleRecord:
    """One completion: where it came from (``line``: 1-based line of the file, or record index + 1)."""

    line: int
    prompt: tuple[int, ...]
    completion: tuple[int, ...]
    seed: int | None = None
    finish_reason: str | None = None
    index: int | None = None  # position of the sample among the n of one request (shares its seed)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _id_list(value, key: str, where: str, vocab: int, *, allow_empty: bool) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise SamplesInputError(f"{where}: {key!r} must be a list of ints, got {type(value).__name__}")
    bad = [x for x in value if not _is_int(x)]
    if bad:
        raise SamplesInputError(f"{where}: {key!r} must hold ints only, got {bad[0]!r}")
    if not value and not allow_empty:
        raise SamplesInputError(f"{where}: {key!r} is empty (the prompt needs at least one token)")
    out = [i for i in value if not 0 <= i < vocab]
    if out:
        pos = value.index(out[0])
        raise SamplesInputError(
            f"{where}: {key!r}[{pos}] = {out[0]} is outside the vocabulary [0, {vocab}) of the model"
        )
    return tuple(value)


def _parse_record(obj, where: str, line: int, vocab: int, min_context: int, max_positions: int | None, max_new_tokens: int,
                  model=None) -> SampleRecord:
    if not isinstance(obj, dict):
        raise SamplesInputError(f"{where}: each line must be a JSON object, got {type(obj).__name__}")
    missing = [key for key in ("prompt_ids", "completion_ids") if key not in obj]
    if missing:
        raise SamplesInputError(f"{where}: missing field(s) {', '.join(missing)} (have: {', '.join(sorted(obj)) or 'none'})")
    prompt = _id_list(obj["prompt_ids"], "prompt_ids", where, vocab, allow_empty=False)
    completion = _id_list(obj["completion_ids"], "completion_ids", where, vocab, allow_empty=True)
    if len(prompt) < min_context:
        raise SamplesInputError(
            f"{where}: the prompt has {len(prompt)} token(s); this model's law is defined for prompts of at least {min_context}"
        )
    if max_positions is not None and len(prompt) + max_new_tokens > max_positions + 1:
        raise SamplesInputError(
            f"{where}: prompt length {len(prompt)} + max_new_tokens {max_new_tokens} exceeds the model's "
            f"{max_positions} positions"
        )
    check_context = getattr(model, "cell", None)  # an ExactModel says which contexts its law is defined for
    if check_context is not None:
        try:
            check_context(list(prompt))
        except ValueError as exc:
            raise SamplesInputError(f"{where}: prompt_ids {list(prompt)} is not a valid context of the model: {exc}") from None
    seed = obj.get("seed")
    if seed is not None and not _is_int(seed):
        raise SamplesInputError(f"{where}: 'seed' must be an int or null, got {seed!r}")
    finish = obj.get("finish_reason")
    if finish is not None and finish not in FINISH_EOS + FINISH_LENGTH:
        raise SamplesInputError(
            f"{where}: unknown finish_reason {finish!r}; expected one of {', '.join(FINISH_EOS + FINISH_LENGTH)} or null"
        )
    index = obj.get("index")
    if index is not None and not (_is_int(index) and index >= 0):
        raise SamplesInputError(f"{where}: 'index' must be an int >= 0 or null, got {index!r}")
    return SampleRecord(line, prompt, completion, seed=seed, finish_reason=finish, index=index)


def read_records(
    path_or_records, *, vocab: int, max_new_tokens: int, min_context: int = 1, max_positions: int | None = None, model=None
) -> tuple[list[SampleRecord], str]:
    """Parse and validate completions: a JSONL path (``str`` / ``Path``) or an iterable of dicts.

    Returns ``(records, source)``; raises :class:`SamplesInputError` naming the line for malformed
    input (see the module docstring). Blank lines are skipped. ``model``: an exact model whose
    ``cell(prompt)`` rejects contexts its law is not defined for (order2: ``<bos>`` first, nowhere else).
    """
    records: list[SampleRecord] = []
    if isinstance(path_or_records, (str, os.PathLike)):
        source = os.fspath(path_or_records)
        try:
            with open(source, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except OSError as exc:
            raise SamplesInputError(f"cannot read {source}: {exc}") from None
        for number, text in enumerate(lines, 1):
            if not text.strip():
                continue
            where = f"{source}:{number}"
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise SamplesInputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            records.append(_parse_record(obj, where, number, vocab, min_context, max_positions, max_new_tokens, model))
    else:
        source = "<records>"
        for number, obj in enumerate(path_or_records, 1):
            records.append(_parse_record(obj, f"record {number}", number, vocab, min_context, max_positions, max_new_tokens, model))
    if not records:
        raise SamplesInputError(f"{source}: no completions")
    seen: dict[tuple, int] = {}
    for r in records:
        if r.seed is None:
            continue
        key = (r.prompt, r.seed, r.index)
        if key in seen:
            which = f"seed {r.seed}" + (f" with index {r.index}" if r.index is not None else "")
            raise SamplesInputError(
                f"{_where(source, r.line)}: {which} was already used for this prompt on line {seen[key]}: "
                "samples must be independent (one seed per request, 'index' for the n samples of one request, "
                "or no seed field)"
            )
        seen[key] = r.line
    return records, source


def _where(source: str, line: int) -> str:
    return f"record {line}" if source == "<records>" else f"{source}:{line}"


def write_jsonl(path, records: Iterable[dict]) -> str:
    """Write records one JSON object per line; returns the path."""
    path = os.fspath(path)
    with open(path, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    return path


# ----------------------------------------------------------------------------- invariants


def invariant_violations(records: Sequence[SampleRecord], *, max_new_tokens: int, eos_id: int | None, source: str) -> list[str]:
    """Deterministic invariants (module docstring), one message per violating line."""
    problems = []
    for r in records:
        where = _where(source, r.line)
        c = r.completion
        if len(c) > max_new_tokens:
            problems.append(f"{where}: {len(c)} generated tokens > max_new_tokens {max_new_tokens} (wrong --max-new-tokens, or the engine ignores it)")
            continue
        if eos_id is not None and eos_id in c[:-1]:
            at = c.index(eos_id)
            problems.append(f"{where}: {len(c) - at - 1} token(s) after the EOS ({eos_id}) at position {at}: generation must stop at EOS")
            continue
        ends_eos = eos_id is not None and len(c) > 0 and c[-1] == eos_id
        if len(c) < max_new_tokens and not ends_eos:
            why = "ends without EOS" if eos_id is not None else "EOS stopping is off (no --eos)"
            problems.append(f"{where}: {len(c)} generated tokens < max_new_tokens {max_new_tokens} and it {why}: a completion stops only at EOS or max_new_tokens")
            continue
        if r.finish_reason in FINISH_EOS and not ends_eos:
            problems.append(f"{where}: finish_reason {r.finish_reason!r} but the completion does not end with EOS ({eos_id})")
        elif r.finish_reason in FINISH_LENGTH and ends_eos:
            problems.append(f"{where}: finish_reason {r.finish_reason!r} but the completion ends with EOS ({eos_id})")
    return problems


# ----------------------------------------------------------------------------- sampling


def _law(model, prompt, n: int, sampling: SamplingConfig, eos_id: int | None):

    return continuation_law(model, list(prompt), n, sampling, eos_id=eos_id)


def _power_at(law, n: int, alpha: float, tv: float) -> tuple[float, int]:
    """(power of the test of ``law`` with ``n`` samples against ``tv``, df), pooling as goodness_of_fit does."""
    probs = np.asarray(list(law.values()) + ([law.pruned_mass] if law.pruned_mass > 0 else []), dtype=np.float64)
    small = (probs > 0) & (probs * n < MIN_EXPECTED)
    df = int(np.count_nonzero(probs > 0) - small.sum()) - (0 if small.any() else 1)
    return power_against_tv(n, max(df, 0), alpha, tv - float(probs[small].sum())), df


def choose_length(model, prompt, n: int, sampling: SamplingConfig, *, max_new_tokens: int, eos_id: int | None,
                  alpha: float = ALPHA, tv: float = SAMPLES_TV, max_cells: int = MAX_CELLS) -> tuple[int, str]:
    """``(L, why)``: the largest L <= max_new_tokens whose test still has power 0.99 against ``tv`` with ``n`` samples.

    Each extra token multiplies the cells; the pooled small cells and the extra degrees of freedom
    cost power. L = 1 when even one token cannot reach it (its power is then stated as is); the
    enumeration also stops at ``max_cells`` continuations.
    """
    chosen, why = 1, ""
    for length in range(1, max_new_tokens + 1):
        law = _law(model, prompt, length, sampling, eos_id)
        if len(law) > max_cells and length > 1:
            why = f"L={length} would have {len(law)} continuations (> {max_cells})"
            break
        if length > 1 and split_ties(model, prompt, length, sampling, eos_id=eos_id):
            why = f"at L={length} a top-p cut splits tied logits (the law there depends on how ties are sorted)"
            break
        power, df = _power_at(law, n, alpha, tv)
        if power < TARGET_POWER:
            why = (
                f"N={n} samples give power {power:.3f} < {TARGET_POWER:g} against TV {tv:g} at L={length} "
                f"({len(law)} continuations)" if length > 1 else
                f"N={n} samples give power {power:.3f} < {TARGET_POWER:g} against TV {tv:g} even at L=1"
            )
            break
        chosen = length
        if all(len(seq) < length or (eos_id is not None and seq[-1] == eos_id) for seq in law) and length > 1:
            why = f"every continuation ends with EOS by L={length}"
            break
    else:
        why = f"L reaches max_new_tokens {max_new_tokens}"
    return chosen, why


def split_ties(model, prompt, n: int, sampling: SamplingConfig, *, eos_id: int | None) -> list[str]:
    """Rows of the law where the warped support splits a group of exactly tied logits (empty: the law is well defined).

    Top-k keeps every token tied with the k-th, but a top-p cut can fall inside a tie group: then *which*
    tied tokens survive depends on how the sampler sorts equal values (``torch.sort`` descending keeps
    the lowest ids, transformers' ascending ``TopPLogitsWarper`` the highest), so the law is not
    determined by the settings. Ties are judged on each prefix's processed logits (history-dependent
    settings applied on its own history, :func:`properties.sequences.processed_logits64`), the logits the
    cut actually sees. One line per such prefix (generated tokens so far, kept and cut tokens).
    """
    if sampling.greedy:
        return []
    from properties.sequences import processed_logits64
    from specdec_ref.warp import warp

    law = _law(model, prompt, n, sampling, eos_id)
    prefixes = sorted({seq[:i] for seq in law for i in range(len(seq))})
    rows = processed_logits64(model, list(prompt), prefixes, sampling, eos_id=eos_id)
    kept = warp(rows, sampling, dtype=torch.float64) > 0
    problems = []
    for prefix, z, keep in zip(prefixes, rows, kept):
        if keep.all():
            continue
        lowest_kept = float(z[keep].min())
        tied_out = [int(t) for t in torch.nonzero(~keep & (z == lowest_kept)).flatten()]
        if tied_out:
            tied_in = [int(t) for t in torch.nonzero(keep & (z == lowest_kept)).flatten()]
            problems.append(
                f"after {list(prompt) + list(prefix)}: tokens {tied_in} and {tied_out} have the same logit "
                f"{lowest_kept:g}; the cut keeps {tied_in} and drops {tied_out}"
            )
    return problems


@dataclass
class PromptReport:
    """One prompt's test: ``fit`` (sampling) or greedy divergences / flips."""

    prompt: tuple[int, ...]
    n: int
    lines: list[int]
    length: int | None = None
    length_reason: str = ""
    fit: FitResult | None = None
    divergences: list[dict] = field(default_factory=list)  # algorithmic: line, position, expected, got, verdict
    flips: list[dict] = field(default_factory=list)  # numerical flips (reported, not failures)

    @property
    def passed(self) -> bool:
        return (self.fit is None or self.fit.passed) and not self.divergences


def _sampling_test(model, prompt, group: list[SampleRecord], sampling, *, max_new_tokens, eos_id, length, alpha, tv) -> PromptReport:

    n = len(group)
    if length is None:
        length, reason = choose_length(model, prompt, n, sampling, max_new_tokens=max_new_tokens, eos_id=eos_id, alpha=alpha, tv=tv)
    else:
        reason = "set by --length"
    split = split_ties(model, prompt, length, sampling, eos_id=eos_id)
    if split:
        raise AmbiguousLawError(
            f"prompt {list(prompt)}: with these settings the law of the first {length} token(s) is not determined by "
            f"them: {split[0]}{f' (and {len(split) - 1} more)' if len(split) > 1 else ''}. Which tied tokens a top-p cut "
            "keeps depends on how the sampler sorts equal logits (torch.sort descending keeps the lowest ids, "
            "transformers' TopPLogitsWarper the highest); choose another top_p (or top_k) for this prompt"
            + (", or a smaller --length" if length > 1 else "")
        )
    cells = law_to_cells(_law(model, prompt, length, sampling, eos_id))
    counts = cells.counts(r.completion[:length] for r in group)
    settings = _settings_label(sampling, eos_id)
    fit = goodness_of_fit(
        counts, cells.probs, what=f"prompt {list(prompt)}: first {length} generated token(s) ({settings})",
        labels=cells.labels, alpha=alpha, tv=tv,  # the verdict prints the replay command once
    )
    report = PromptReport(prompt, n, [r.line for r in group], length, reason, fit)
    if fit.impossible:
        examples = cells.impossible_examples(r.completion[:length] for r in group)
        lines = [r.line for r in group if cells.index_of(r.completion[:length]) == len(cells.labels) - 1][:5]
        report.length_reason += f"; impossible continuations {examples} on line(s) {lines}"
    return report


# ----------------------------------------------------------------------------- greedy


def _classify(model, prefix: list[int], got: int | None, z: torch.Tensor, dtype, position: int, tolerance: float | None = None) -> FlipVerdict:
    """properties.flips' verdict for the engine's ``got`` against the greedy choice, from table logits ``z``."""
    order = torch.argsort(-z, stable=True)
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(z.shape[-1])
    top1_token, top2_token = int(order[0]), int(order[1]) if z.shape[-1] > 1 else int(order[0])
    top1, top2 = float(z[top1_token]), float(z[top2_token])
    # the row's logit scale over tokens of positive probability (order2's <bos> logit, -2**16, is a mask, not a scale)
    scale = float(z[torch.softmax(z, -1) > 0].abs().max())
    tol = tolerance_for(dtype, None, scale) if tolerance is None else float(tolerance)
    la = None if got is None else float(z[got])
    if la is None:
        kind, gap_between = ALGORITHMIC_DIVERGENCE, None
    else:
        gap_between = abs(la - top1)
        kind = NUMERICAL_FLIP if top1 - la <= tol else ALGORITHMIC_DIVERGENCE
    note = "exact tie in the table" if la is not None and la == top1 else ""
    return FlipVerdict(
        prefix=list(prefix), token_a=got, token_b=top1_token, logit_a=la, logit_b=top1,
        rank_a=None if got is None else int(ranks[got]), rank_b=0, top1=top1, top2=top2,
        top1_token=top1_token, top2_token=top2_token, gap_top1_top2=top1 - top2, gap_between=gap_between,
        logits_scale=scale, tolerance=tol, dtype=str(dtype), kind=kind, position=position,
        labels=("engine", "greedy"), note=note,
    )


def _greedy_walk(model, prompt, completion, *, max_new_tokens, eos_id, dtype, tolerance=None) -> tuple[dict | None, list[dict]]:
    """Walk one completion along the engine's path: ``(first algorithmic divergence or None, flips)``."""
    steps = min(len(completion) + 1, max_new_tokens)  # one row per position the engine chose (or stopped) at
    flips = []
    for i in range(steps):
        if eos_id is not None and i > 0 and completion[i - 1] == eos_id:
            return None, flips  # stopped at EOS (tokens after it are an invariant violation)
        context = list(prompt) + list(completion[:i])
        z = next_logits64(model, [context])[0]  # row by row: a context past a divergence is never evaluated
        got = completion[i] if i < len(completion) else None
        expected = int(torch.argmax(z))
        if got == expected:
            continue
        verdict = _classify(model, context, got, z, dtype, i, tolerance)
        entry = {"position": i, "expected": expected, "got": got, "verdict": verdict}
        if verdict.kind == NUMERICAL_FLIP:
            flips.append(entry)
            continue
        return entry, flips
    return None, flips


def _greedy_test(model, prompt, group: list[SampleRecord], *, max_new_tokens, eos_id, dtype, tolerance=None) -> PromptReport:
    report = PromptReport(prompt, len(group), [r.line for r in group])
    done: dict[tuple, tuple] = {}
    for r in group:
        if r.completion not in done:
            done[r.completion] = _greedy_walk(
                model, prompt, r.completion, max_new_tokens=max_new_tokens, eos_id=eos_id, dtype=dtype, tolerance=tolerance
            )
        divergence, flips = done[r.completion]
        if divergence is not None:
            report.divergences.append({**divergence, "line": r.line, "completion": list(r.completion)})
        report.flips.extend({**f, "line": r.line} for f in flips)
    return report


# ----------------------------------------------------------------------------- verdict


def _settings_label(sampling: SamplingConfig, eos_id: int | None) -> str:
    if sampling.greedy:
        parts = ["greedy"]
    else:
        parts = [f"temperature={sampling.temperature:g}"]
        if sampling.top_k is not None:
            parts.append(f"top_k={sampling.top_k}")
        if sampling.top_p is not None:
            parts.append(f"top_p={sampling.top_p:g}")
    for _, name, _, off in _EXTRA_SETTINGS:
        value = getattr(sampling, name)
        if value != off and not (sampling.greedy and name == "min_p"):
            parts.append(f"{name}={value:g}")
    parts.append(f"eos_id={eos_id}" if eos_id is not None else "no EOS stop")
    return ", ".join(parts)


def replay_command(model_name: str, sampling: SamplingConfig, *, max_new_tokens: int, eos: bool, length: int | None,
                   source: str, dtype: str | None = None, tv: float = SAMPLES_TV, tolerance: float | None = None) -> str:
    """The command line that reproduces a verdict."""
    args = ["python", "-m", "conformance.samples", "--model", model_name]
    for flag, name, _, off in _EXTRA_SETTINGS:
        value = getattr(sampling, name)
        if value != off and not (sampling.greedy and name == "min_p"):
            args += [flag, f"{value:g}"]
    if sampling.greedy:
        args.append("--greedy")
        if tolerance is not None:
            args += ["--tolerance", f"{tolerance:g}"]
        elif dtype and dtype != "float32":
            args += ["--dtype", dtype]
    else:
        args += ["--temperature", f"{sampling.temperature:g}"]
        if sampling.top_k is not None:
            args += ["--top-k", str(sampling.top_k)]
        if sampling.top_p is not None:
            args += ["--top-p", f"{sampling.top_p:g}"]
        if length is not None:
            args += ["--length", str(length)]
        if tv != SAMPLES_TV:
            args += ["--tv", f"{tv:g}"]
    args += ["--max-new-tokens", str(max_new_tokens)]
    if eos:
        args.append("--eos")
    args.append(source)
    return shlex.join(args)


@dataclass
class SamplesVerdict:
    """The outcome of :func:`certify_samples`: ``headline`` (the verdict words), ``level``, every test."""

    level: str  # "certified" | "reduced" | "not_certified" | "inconclusive"
    headline: str
    model: str
    sampling: SamplingConfig
    max_new_tokens: int
    eos_id: int | None
    source: str
    n: int
    prompts: list[PromptReport]
    violations: list[str]
    alpha: float
    tv: float
    replay: str
    power_note: str = ""
    transitions: FitResult | None = None  # every generated token after the first, pooled by context class
    position_fits: list[tuple[int, FitResult]] = field(default_factory=list)  # (position, its transition test)
    transition_classes: int = 0
    transition_excluded: dict = field(default_factory=dict)

    @property
    def positions_tested(self) -> list[int]:
        """The generated positions (1-based) some test covered: 1..L of the full-law tests and every transition."""
        tested = set()
        for p in self.prompts:
            if p.fit is not None and p.length:
                tested.update(range(1, p.length + 1))
        tested.update(pos for pos, _ in self.position_fits)
        return sorted(tested)

    @property
    def certified(self) -> bool:
        return self.level in ("certified", "reduced")

    @property
    def exit_code(self) -> int:
        return 0 if self.certified else 1

    @property
    def fits(self) -> list[FitResult]:
        """The tests the verdict rests on: the prompts' full-law tests, then the pooled transition test.

        ``position_fits`` (the same transition statistic per generated position) localise a departure; they
        share the pooled test's alpha and are not counted as further tests.
        """
        out = [p.fit for p in self.prompts if p.fit is not None]
        return out + ([self.transitions] if self.transitions is not None else [])

    @property
    def divergences(self) -> list[dict]:
        return [d for p in self.prompts for d in p.divergences]

    @property
    def flips(self) -> list[dict]:
        return [f for p in self.prompts for f in p.flips]

    def report(self) -> str:
        lines = [self.headline]
        mode = "greedy" if self.sampling.greedy else "sampling"
        lines.append(
            f"model {self.model}, {mode} ({_settings_label(self.sampling, self.eos_id)}), max_new_tokens={self.max_new_tokens}; "
            f"{self.source}: N={self.n} completions of {len(self.prompts)} prompt(s)"
        )
        if not self.sampling.greedy:
            n_tests = len(self.fits)
            lines.append(
                "statistics: Pearson chi-square against the exact law from the tables, per prompt (the first L tokens) and "
                "per context class (every token after the first given its context); "
                f"family-wise alpha={self.alpha:g} ({self.alpha / max(n_tests, 1):.3g} per test, {n_tests} tests); "
                f"alternative: every law at TV >= {self.tv:g}; power target {TARGET_POWER:g}"
            )
        else:
            lines.append(
                "greedy: every completion compared token for token with the target's greedy continuation "
                "(deterministic: no alpha, no power; divergences classified as in properties.flips)"
            )
        for p in self.prompts:
            if p.fit is not None:
                f = p.fit
                status = "pass" if f.passed else "FAIL"
                lines.append(
                    f"  prompt {list(p.prompt)}: N={f.n}, L={p.length} ({len(f.labels) - 1} cells; {p.length_reason}), "
                    f"chi-square {f.statistic:.1f} on {f.df} df, p={f.p_value:.3g}, alpha={f.alpha:.3g}, "
                    f"power {f.power:.4f} against TV {f.tv:g}, detects TV >= {f.detects:.3g}: {status}"
                )
                if not f.passed:
                    lines.extend("    " + x for x in f.report().splitlines()[1:])
            else:
                status = "pass" if p.passed else "FAIL"
                lines.append(
                    f"  prompt {list(p.prompt)}: N={p.n} greedy completions, {len(p.divergences)} algorithmic divergence(s), "
                    f"{len(p.flips)} numerical flip(s): {status}"
                )
                for d in p.divergences[:5]:
                    got = "<end of completion>" if d["got"] is None else d["got"]
                    lines.append(
                        f"    {_where(self.source, d['line'])}: prompt {list(p.prompt)}, position {d['position']}: "
                        f"expected {d['expected']}, got {got}; completion {d['completion']}"
                    )
                    lines.append("      " + d["verdict"].describe())
                if len(p.divergences) > 5:
                    lines.append(f"    ... {len(p.divergences) - 5} more divergent completions")
                for fl in p.flips[:3]:
                    lines.append(f"    numerical flip ({_where(self.source, fl['line'])}): " + fl["verdict"].describe())
        if not self.sampling.greedy:
            lines.extend(self._transition_lines())
        if self.violations:
            lines.append(f"deterministic invariants: {len(self.violations)} violation(s):")
            lines.extend("  " + v for v in self.violations[:20])
            if len(self.violations) > 20:
                lines.append(f"  ... {len(self.violations) - 20} more")
        else:
            lines.append("deterministic invariants: ok (max_new_tokens tokens unless ended by EOS, nothing after EOS)")
        if self.power_note:
            lines.append(self.power_note)
        lines.append(f"replay: {self.replay}")
        return "\n".join(lines)

    def _transition_lines(self) -> list[str]:
        tested = self.positions_tested
        span = f"{tested[0]}-{tested[-1]}" if len(tested) > 1 else (str(tested[0]) if tested else "none")
        lines = [f"positions tested: {span}" + ("" if self.transitions is not None else
                                                 " (no position after the first: speculation untested)")]
        f = self.transitions
        if f is None:
            return lines
        status = "pass" if f.passed else "FAIL"
        lines.append(
            f"  {f.what.split(':')[0]}: N={f.n} tokens in {self.transition_classes} context class(es), chi-square "
            f"{f.statistic:.1f} on {f.df} df, p={f.p_value:.3g}, alpha={f.alpha:.3g}, power {f.power:.4f} against TV "
            f"{f.tv:g}, detects TV >= {f.detects:.3g}: {status}"
        )
        if not f.passed:
            lines.extend("    " + x for x in f.report().splitlines()[1:])
        if self.position_fits:
            lines.append("    per position (localisation, not further tests; 'departs' where p < the pooled test's alpha):")
        for pos, pf in self.position_fits:
            status = "departs" if not pf.passed else "ok"
            lines.append(
                f"    position {pos}: N={pf.n}, chi-square {pf.statistic:.1f} on {pf.df} df, p={pf.p_value:.3g}, "
                f"detects TV >= {pf.detects:.3g}: {status}"
            )
            if not pf.passed and f.passed is False and pos == min(q for q, g in self.position_fits if not g.passed):
                lines.extend("      " + x for x in pf.table(max_rows=8).splitlines())
        for why, k in self.transition_excluded.items():
            lines.append(f"  {k} token(s) not tested: {why}")
        return lines

    def as_record(self) -> dict:
        return {
            "level": self.level,
            "positions_tested": self.positions_tested,
            "transition_positions": [pos for pos, _ in self.position_fits],
            "transition_classes": self.transition_classes,
            "transition_excluded": dict(self.transition_excluded),
            "localisation": [{"position": pos, **pf.as_record()} for pos, pf in self.position_fits],
            "headline": self.headline,
            "certified": self.certified,
            "model": self.model,
            "sampling": self.sampling.as_dict(),
            "max_new_tokens": self.max_new_tokens,
            "eos_id": self.eos_id,
            "n": self.n,
            "alpha": self.alpha,
            "tv": self.tv,
            "statistics": [f.as_record() for f in self.fits],
            "violations": list(self.violations),
            "divergences": [
                {k: (v.as_record() if isinstance(v, FlipVerdict) else v) for k, v in d.items()} for d in self.divergences
            ],
            "replay": self.replay,
        }


def certify_samples(
    path_or_records,
    *,
    model,
    sampling: SamplingConfig,
    max_new_tokens: int,
    eos_id: int | None = None,
    length: int | None = None,
    alpha: float = ALPHA,
    tv: float = SAMPLES_TV,
    dtype: torch.dtype | str = torch.float32,
    tolerance: float | None = None,
) -> SamplesVerdict:
    """Judge completions of ``model`` (an exact model's name or object) produced with ``sampling``.

    ``path_or_records``: a JSONL path or an iterable of dicts (module docstring). ``eos_id``: the EOS
    the engine stopped at (``True``: the model's own; ``None``: no EOS stop). ``length``: the L of the
    sequence law (default: :func:`choose_length` per prompt). ``dtype``: what the engine computed in
    (greedy: the flip tolerance is :func:`properties.flips.tolerance_for` of it at the row's logit scale);
    ``tolerance``: an absolute logit tolerance instead. Raises :class:`SamplesInputError` for malformed input.
    """
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a specdec_ref.warp.SamplingConfig, got {type(sampling).__name__}")
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    exact = _resolve_model(model)
    if eos_id is True:
        eos_id = int(exact.eos_id)
    vocab = _vocab(exact)
    if eos_id is not None and not (_is_int(eos_id) and 0 <= eos_id < vocab):
        raise ValueError(f"eos_id must be None, True or a token id in [0, {vocab}), got {eos_id!r}")
    if length is not None and not (_is_int(length) and 1 <= length <= max_new_tokens):
        raise ValueError(f"length must be an int in [1, max_new_tokens={max_new_tokens}], got {length!r}")
    dtype = getattr(torch, dtype.removeprefix("torch.")) if isinstance(dtype, str) else dtype
    records, source = read_records(
        path_or_records, vocab=vocab, max_new_tokens=max_new_tokens,
        min_context=int(getattr(exact, "min_context", 1) or 1), max_positions=_max_positions(exact), model=exact,
    )
    name = model if isinstance(model, str) else _model_name(exact)
    replay = replay_command(
        name, sampling, max_new_tokens=max_new_tokens, eos=eos_id is not None, length=length, source=source,
        dtype=str(dtype).removeprefix("torch."), tv=tv, tolerance=tolerance,
    )
    groups: dict[tuple[int, ...], list[SampleRecord]] = {}
    for r in records:
        groups.setdefault(r.prompt, []).append(r)
    violations = invariant_violations(records, max_new_tokens=max_new_tokens, eos_id=eos_id, source=source)
    counts = None
    position_tests: list[int] = []
    if not sampling.greedy:
        counts = count_transitions(exact, ((r.prompt, r.completion) for r in records), sampling, eos_id=eos_id)
        if len(counts.positions) > 1:  # with one position the pooled test is that position's test
            position_tests = [pos for pos in counts.positions if pos <= MAX_POSITION_TESTS]
    # alpha split evenly over the tests the verdict rests on: the prompts' full-law tests and the pooled transition
    # test (the per-position transition statistics localise a departure; they are not further tests)
    n_tests = len(groups) + (1 if counts is not None and counts.n else 0)
    per_alpha = alpha / n_tests
    reports = []
    for prompt, group in groups.items():
        if sampling.greedy:
            reports.append(_greedy_test(
                exact, prompt, group, max_new_tokens=max_new_tokens, eos_id=eos_id, dtype=dtype, tolerance=tolerance
            ))
        else:
            reports.append(_sampling_test(
                exact, prompt, group, sampling, max_new_tokens=max_new_tokens, eos_id=eos_id, length=length,
                alpha=per_alpha, tv=tv,
            ))
    transitions, position_fits = None, []
    if counts is not None and counts.n:
        settings = _settings_label(sampling, eos_id)
        last = counts.positions[-1]
        transitions = transition_test(
            counts, what=f"positions {FIRST_TESTED_POSITION}-{last}: every generated token after the first given its context ({settings})",
            alpha=per_alpha, tv=tv,
        )
        position_fits = [
            (pos, transition_test(counts, what=f"position {pos}: the generated token given its context ({settings})",
                                  positions=[pos], alpha=per_alpha, tv=tv))
            for pos in position_tests
        ]
    failed = [p for p in reports if not p.passed]
    failed_transitions = transitions is not None and not transitions.passed
    note = ""
    if violations or failed or failed_transitions:
        parts = []
        if failed:
            what = "sequence law" if not sampling.greedy else "greedy continuation"
            parts.append(f"{len(failed)} of {len(reports)} prompt(s) fail the {what}")
        if failed_transitions:
            where = sorted(pos for pos, f in position_fits if not f.passed)
            parts.append("the law of the tokens after the first fails" + (
                f" (departs first at position {where[0]})" if where else ""))
        if violations:
            parts.append(f"{len(violations)} invariant violation(s)")
        level, headline = "not_certified", f"{NOT_CERTIFIED}: " + ", ".join(parts)
    elif sampling.greedy:
        level, headline = "certified", CERTIFIED
        if any(p.flips for p in reports):
            within = f"tolerance {tolerance:g}" if tolerance is not None else f"the {dtype} tolerance"
            note = f"{sum(len(p.flips) for p in reports)} numerical flip(s) within {within} (reported, not failures)"
    elif transitions is None:
        level = "inconclusive"
        headline = f"{INCONCLUSIVE}: no generated position after the first was tested (speculation untested)"
        note = ("the first generated token is sampled from the prefill, before any draft exists; a file tests drafted "
                "positions only when its completions have 2 or more tokens"
                + (f"; {sum(counts.excluded.values())} transition(s) excluded: " + "; ".join(counts.excluded)
                   if counts is not None and counts.excluded else ""))
    else:
        power, why = judge_power([p.fit.as_record() for p in reports] + [transitions.as_record()])
        if power == "inconclusive":
            level, headline = "inconclusive", f"{INCONCLUSIVE}: too few samples"
            note = why
        elif power == "reduced":
            x = max([p.fit.detects for p in reports] + [transitions.detects])
            level, headline = "reduced", f"{REDUCED}: detects TV >= {x:.3g}"
            note = f"too few samples for power {TARGET_POWER:g} against TV {tv:g}; {why}"
        else:
            level, headline = "certified", CERTIFIED
            note = f"every prompt's test has power >= {TARGET_POWER:g} against TV {tv:g}"
    return SamplesVerdict(
        level=level, headline=headline, model=name, sampling=sampling, max_new_tokens=max_new_tokens, eos_id=eos_id,
        source=source, n=len(records), prompts=reports, violations=violations, alpha=alpha, tv=tv, replay=replay,
        power_note=note, transitions=transitions, position_fits=position_fits,
        transition_classes=len(counts.classes) if counts is not None else 0,
        transition_excluded=dict(counts.excluded) if counts is not None else {},
    )


# ----------------------------------------------------------------------------- producing a file


def _hf_sampling_kwargs(sampling: SamplingConfig) -> dict:
    if sampling.greedy:
        return dict(do_sample=False)
    # unset, transformers would add its default top_k=50
    return dict(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or 0, top_p=sampling.top_p or 1.0)


def generate_with_transformers(
    pair_name: str,
    prompts: Sequence[Sequence[int]],
    n: int,
    sampling: SamplingConfig,
    max_new_tokens: int,
    seed: int,
    *,
    eos: bool = True,
    assisted: bool = True,
    num_assistant_tokens: int | None = None,
    progress=None,
) -> list[dict]:
    """``n`` completions per prompt from transformers' own ``target.generate(..., assistant_model=draft)`` on a shipped pair.

    One ``generate`` call per sample (assisted generation is batch 1), the global torch RNG
    seeded with ``seed + i`` for the i-th sample (inside ``fork_rng``; the seed is recorded).
    ``eos``: stop at the model's EOS (else ``eos_token_id=[]``: ``None`` would fall back to the checkpoint's
    own ``generation_config``, which stops at EOS). ``assisted=False`` runs plain
    ``generate`` (no draft). ``num_assistant_tokens``: pin the draft length (default: transformers'
    own schedule). Returns records for :func:`certify_samples` / :func:`write_jsonl`.
    """
    import transformers
    from transformers import GenerationConfig

    from specdec_ref.exact_models import exact_pair

    pair = exact_pair(pair_name)
    target, draft = pair.target.load(), pair.draft.load() if assisted else None
    eos_id = int(pair.target.eos_id) if eos else None
    # eos_token_id=None would fall back to the checkpoint's generation_config (EOS 7); [] turns stopping off
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, eos_token_id=eos_id if eos_id is not None else [],
        pad_token_id=eos_id if eos_id is not None else 0, **_hf_sampling_kwargs(sampling),
    )
    saved = None
    if assisted and num_assistant_tokens is not None:
        gc = draft.generation_config
        saved = {k: getattr(gc, k, None) for k in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = num_assistant_tokens, "constant", 0.0
    engine = f"transformers {transformers.__version__} generate({'assistant_model=' + pair.draft.name if assisted else 'no draft'})"
    out_records = []
    count = 0
    try:
        for prompt in prompts:
            ids = torch.tensor([list(prompt)], dtype=torch.long)
            for _ in range(n):
                s = seed + count
                count += 1
                with torch.random.fork_rng(devices=[]), torch.no_grad():
                    torch.manual_seed(s)
                    kwargs = dict(assistant_model=draft) if assisted else {}
                    out = target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, **kwargs)
                completion = out[0, ids.shape[1]:].tolist()
                if eos_id is not None and eos_id in completion:
                    completion = completion[: completion.index(eos_id) + 1]
                ended = eos_id is not None and completion and completion[-1] == eos_id
                out_records.append({
                    "prompt_ids": list(prompt), "completion_ids": completion, "seed": s,
                    "finish_reason": "stop" if ended else "length", "engine": engine,
                })
                if progress is not None:
                    progress(count)
    finally:
        if saved is not None:
            for k, v in saved.items():
                setattr(draft.generation_config, k, v)
    return out_records


# ----------------------------------------------------------------------------- command line


#: The history-dependent and min-p settings the certify command accepts: (flag, SamplingConfig field, type, off value).
_EXTRA_SETTINGS = (
    ("--min-p", "min_p", float, None),
    ("--repetition-penalty", "repetition_penalty", float, 1.0),
    ("--presence-penalty", "presence_penalty", float, 0.0),
    ("--frequency-penalty", "frequency_penalty", float, 0.0),
    ("--min-new-tokens", "min_new_tokens", int, 0),
)


def _sampling_from_args(args) -> SamplingConfig:
    extra = {name: getattr(args, name) for _, name, _, _ in _EXTRA_SETTINGS if hasattr(args, name)}
    if args.greedy:
        return SamplingConfig(greedy=True, **{k: v for k, v in extra.items() if k != "min_p"})
    return SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, **extra)


def _add_extra_setting_args(parser: argparse.ArgumentParser) -> None:
    for flag, name, kind, off in _EXTRA_SETTINGS:
        parser.add_argument(flag, dest=name, type=kind, default=off, help=f"the engine's {name} (default: off)")


def _add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1)")
    parser.add_argument("--top-k", type=int, default=None, help="top-k (default: none)")
    parser.add_argument("--top-p", type=float, default=None, help="top-p (default: none)")
    parser.add_argument("--greedy", action="store_true", help="greedy decoding: compare with the greedy continuation")
    parser.add_argument("--max-new-tokens", type=int, default=4, help="the engine's max_new_tokens (default 4)")
    parser.add_argument("--eos", action="store_true", help="the engine stopped at the model's EOS token")


def _certify_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.samples",
        description="Certify completions of a shipped exactly-known checkpoint produced by any engine "
        "(subcommand `generate` produces such a file with transformers).",
    )
    parser.add_argument("file", help="JSONL: one object per line with prompt_ids, completion_ids (and optional seed, finish_reason)")
    parser.add_argument("--model", required=True, help="the exact model the completions come from (e.g. order1-target) or a pair name")
    _add_sampling_args(parser)
    _add_extra_setting_args(parser)
    parser.add_argument("--length", type=int, default=None, help="L, the number of first tokens whose law is tested (default: chosen from N)")
    parser.add_argument("--tv", type=float, default=SAMPLES_TV, help=f"the alternative the power is stated against (default {SAMPLES_TV})")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="greedy: the dtype the engine ran in (flip tolerance)")
    parser.add_argument("--tolerance", type=float, default=None, help="greedy: absolute logit tolerance of a numerical flip (overrides --dtype)")
    parser.add_argument("--json", default=None, help="also write the verdict as JSON to this path")
    args = parser.parse_args(argv)
    try:
        sampling = _sampling_from_args(args)
        verdict = certify_samples(
            args.file, model=args.model, sampling=sampling, max_new_tokens=args.max_new_tokens,
            eos_id=True if args.eos else None, length=args.length, tv=args.tv, dtype=args.dtype, tolerance=args.tolerance,
        )
    except SamplesInputError as exc:
        print(f"INPUT ERROR: {exc}", file=sys.stderr)
        print(f"{NOT_CERTIFIED}: the completions could not be read", file=sys.stdout)
        return 1
    except AmbiguousLawError as exc:
        print(f"SETTINGS ERROR: {exc}", file=sys.stderr)
        print(f"{INCONCLUSIVE}: the exact law is not defined by these settings", file=sys.stdout)
        return 1
    except ValueError as exc:
        print(f"INPUT ERROR: {exc}", file=sys.stderr)
        return 1
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
