"""The completions' input: parse and validate a completions file (JSONL path or records) for an exact model.

Invariant: every :class:`SampleRecord` :func:`read_records` returns has ids inside the model's vocabulary, a
prompt the model's law is defined for, and at most one sample per ``(prompt, seed, index)``; anything else
raises :class:`SamplesInputError` naming the line. :func:`invariant_violations` lists the deterministic
invariants a well-formed completion can still break (its length, what follows an EOS, its ``finish_reason``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterable, Sequence
from ..report import show_ids


FINISH_EOS = ("stop", "eos")
FINISH_LENGTH = ("length", "max_new_tokens")
FINISH_ERROR = ("error", "abort")  # the engine ended the request itself: always a violation, named


class SamplesInputError(ValueError):
    """The completions file (or records) is malformed; the message names the line."""



# ----------------------------------------------------------------------------- the model


def _resolve_model(model):
    """An exact model (by name, or a pair name: its target), or the object itself (ExactModel / torch module)."""
    if isinstance(model, str):
        from specdec_ref import exact
        if model in exact.EXACT_MODELS or model.endswith(exact.SHIFTED):  # NAME+shift: past a shift
            try:
                return exact.exact_model(model)
            except ValueError as exc:
                raise SamplesInputError(str(exc)) from None
        if model in exact.EXACT_PAIRS:
            return exact.exact_pair(model).target
        raise SamplesInputError(
            f"unknown model {model!r}; shipped exact models: {', '.join(sorted(exact.EXACT_MODELS))} "
            f"(or a pair: {', '.join(sorted(exact.EXACT_PAIRS))})"
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
    text: str | None = None  # the generated text the engine returned (checked against the tokens under stop strings)


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


def _checked_prompt(raw, where: str, vocab: int, min_context: int, max_positions: int | None, max_new_tokens: int,
                    model) -> tuple[int, ...]:
    """A prompt's ids, validated for the model: the vocabulary, its length, a context the model's law is defined for."""
    prompt = _id_list(raw, "prompt_ids", where, vocab, allow_empty=False)
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
            raise SamplesInputError(f"{where}: prompt_ids {show_ids(prompt)} is not a valid context of the model: {exc}") from None
    return prompt


def _parse_record(obj, where: str, line: int, vocab: int, min_context: int, max_positions: int | None, max_new_tokens: int,
                  model=None, checked_prompts: dict | None = None) -> SampleRecord:
    """One line as a record (``checked_prompts``: the prompts validated so far, so each distinct one is checked once)."""
    if not isinstance(obj, dict):
        raise SamplesInputError(f"{where}: each line must be a JSON object, got {type(obj).__name__}")
    missing = [key for key in ("prompt_ids", "completion_ids") if key not in obj]
    if missing:
        raise SamplesInputError(f"{where}: missing field(s) {', '.join(missing)} (have: {', '.join(sorted(obj)) or 'none'})")
    raw = obj["prompt_ids"]
    key = tuple(raw) if type(raw) is list and all(type(x) is int for x in raw) else None  # bool is no int here
    prompt = None if checked_prompts is None or key is None else checked_prompts.get(key)
    if prompt is None:
        prompt = _checked_prompt(raw, where, vocab, min_context, max_positions, max_new_tokens, model)
        if checked_prompts is not None and key is not None:
            checked_prompts[key] = prompt
    completion = _id_list(obj["completion_ids"], "completion_ids", where, vocab, allow_empty=True)
    seed = obj.get("seed")
    if seed is not None and not _is_int(seed):
        raise SamplesInputError(f"{where}: 'seed' must be an int or null, got {seed!r}")
    finish = obj.get("finish_reason")
    if finish is not None and finish not in FINISH_EOS + FINISH_LENGTH + FINISH_ERROR:
        raise SamplesInputError(
            f"{where}: unknown finish_reason {finish!r}; expected one of "
            f"{', '.join(FINISH_EOS + FINISH_LENGTH + FINISH_ERROR)} or null"
        )
    index = obj.get("index")
    if index is not None and not (_is_int(index) and index >= 0):
        raise SamplesInputError(f"{where}: 'index' must be an int >= 0 or null, got {index!r}")
    text = obj.get("text")
    if text is not None and not isinstance(text, str):
        raise SamplesInputError(f"{where}: 'text' must be a string or null, got {type(text).__name__}")
    return SampleRecord(line, prompt, completion, seed=seed, finish_reason=finish, index=index, text=text)


def read_records(
    path_or_records, *, vocab: int, max_new_tokens: int, min_context: int = 1, max_positions: int | None = None, model=None
) -> tuple[list[SampleRecord], str]:
    """Parse and validate completions: a JSONL path (``str`` / ``Path``) or an iterable of dicts.

    Returns ``(records, source)``; raises :class:`SamplesInputError` naming the line for malformed
    input (see the :mod:`conformance.samples` docstring). Blank lines are skipped. ``model``: an exact model whose
    ``cell(prompt)`` rejects contexts its law is not defined for (order2: ``<bos>`` first, nowhere else).
    """
    records: list[SampleRecord] = []
    checked: dict[tuple, tuple[int, ...]] = {}
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
            records.append(_parse_record(obj, where, number, vocab, min_context, max_positions, max_new_tokens, model,
                                         checked))
    else:
        source = "<records>"
        for number, obj in enumerate(path_or_records, 1):
            records.append(_parse_record(obj, f"record {number}", number, vocab, min_context, max_positions, max_new_tokens,
                                         model, checked))
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


def invariant_violations(records: Sequence[SampleRecord], *, max_new_tokens: int, eos_id: int | None, source: str,
                         stop=None) -> list[str]:
    """Deterministic invariants (:mod:`conformance.samples` docstring), one message per violating line. ``stop``: the
    stop strings (:class:`specdec_properties.stops.StopStrings`) a completion also ends at, and the text it must return."""
    problems = []
    for r in records:
        where = _where(source, r.line)
        c = r.completion
        if len(c) > max_new_tokens:
            problems.append(f"{where}: {len(c)} generated tokens > max_new_tokens {max_new_tokens} (wrong --max-new-tokens, or the engine ignores it)")
            continue
        if r.finish_reason in FINISH_ERROR:
            problems.append(f"{where}: finish_reason {r.finish_reason!r}: the engine ended the request itself after "
                            f"{len(c)} token(s) {list(c)}")
            continue
        if eos_id is not None and eos_id in c[:-1]:
            at = c.index(eos_id)
            problems.append(f"{where}: {len(c) - at - 1} token(s) after the EOS ({eos_id}) at position {at}: generation must stop at EOS")
            continue
        stopped = stop.end(c) if stop is not None else None
        if stopped is not None and stopped < len(c):
            problems.append(
                f"{where}: {len(c) - stopped} token(s) {list(c[stopped:])} after the stop string {stop.matched(c)!r} "
                f"completed at position {stopped} (tokens {list(c)}): generation must stop at the token that completes it")
            continue
        ends_eos = eos_id is not None and len(c) > 0 and c[-1] == eos_id
        ends = ends_eos or stopped is not None
        if len(c) < max_new_tokens and not ends:
            why = ("ends without EOS" if eos_id is not None else "EOS stopping is off (no --eos)") + (
                " or a stop string" if stop is not None and stop.strings else "")
            problems.append(f"{where}: {len(c)} generated tokens < max_new_tokens {max_new_tokens} and it {why}: a completion stops only at EOS{', a stop string' if stop is not None and stop.strings else ''} or max_new_tokens")
            continue
        if r.finish_reason in FINISH_EOS and not ends:
            what = f"EOS ({eos_id})" + (" or a completed stop string" if stop is not None and stop.strings else "")
            problems.append(f"{where}: finish_reason {r.finish_reason!r} but the completion does not end with {what}")
        elif r.finish_reason in FINISH_LENGTH and ends:
            what = f"EOS ({eos_id})" if ends_eos else f"the stop string {stop.matched(c)!r}"
            problems.append(f"{where}: finish_reason {r.finish_reason!r} but the completion ends with {what}"
                            + (" (max_new_tokens judged before the stop string)" if len(c) == max_new_tokens else ""))
        if stop is not None and r.text is not None:
            kind = stop.departure(c, r.text)
            if kind is not None:
                want = stop.returned_text(c)
                problems.append(f"{where}: text {r.text!r} but its tokens {list(c)} render as {want!r}"
                                + _text_hint(kind, r.text, want))
    return problems


def _text_hint(kind: str, got: str, want: str) -> str:
    """The words for a wrong returned text (:meth:`specdec_properties.stops.StopStrings.departure`)."""
    if kind == "not_cut":
        return " (the stop string was not cut from the text)"
    if kind in ("held_back", "missing_end"):
        return f" ({len(want) - len(got)} character(s) missing at the end)"
    if kind == "past_end":
        return f" ({len(got) - len(want)} character(s) past the end)"
    common = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f" (first difference at character {common})"
