"""The exact law a completions file is tested against: its settings, the tested length L, and tie splitting.

Invariant: a law is tested only where the settings determine it (:func:`split_ties` finds no top-p cut inside
a group of tied logits, else :class:`AmbiguousLawError`); L (:func:`choose_length`) is the largest length at
which N samples keep power 0.99 against :data:`SAMPLES_TV`, within :data:`MAX_CELLS` continuations.
"""
from __future__ import annotations

import numpy as np
import torch

from specdec_properties.sequences import continuation_law
from specdec_properties.stats import ALPHA, MIN_EXPECTED, TARGET_POWER, power_against_tv
from specdec_ref.warp import SamplingConfig
from ..report import show_ids


#: The alternative the black-box sampling test states its power against (the decoder-level goal).
SAMPLES_TV = 0.03
#: Largest number of continuations a law may have for :func:`choose_length` to go to that length.
MAX_CELLS = 4096


class AmbiguousLawError(ValueError):
    """The settings make the exact law depend on how a sampler sorts tied logits (:func:`split_ties`)."""


def parse_logit_bias(text: str) -> tuple[tuple[int, float], ...]:
    """``--logit-bias``'s value: ``"3:2.5,5:-1"`` -> ``((3, 2.5), (5, -1.0))`` (token id : bias, comma-separated)."""
    pairs = []
    for item in text.split(","):
        token, sep, bias = item.partition(":")
        if not sep:
            raise ValueError(f"logit bias {item!r} is not TOKEN:BIAS")
        pairs.append((int(token), float(bias)))
    return tuple(sorted(pairs))


def parse_automaton(text: str):
    """``--automaton``'s value: a token automaton as JSON, ``{"transitions": [[next state or -1 per token] per state],
    "start": 0}`` (or the transitions list alone), as :class:`specdec_ref.automaton.TokenAutomaton` states it."""
    import json

    from specdec_ref.automaton import TokenAutomaton

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"automaton {text[:60]!r} is not JSON ({exc.msg})") from None
    if isinstance(data, list):
        data = {"transitions": data}
    if not isinstance(data, dict) or "transitions" not in data:
        raise ValueError('an automaton is {"transitions": [[...], ...], "start": S} or its transitions list')
    return TokenAutomaton(tuple(tuple(row) for row in data["transitions"]), int(data.get("start", 0)))


def parse_bad_words(text: str) -> tuple[tuple[int, ...], ...]:
    """``--bad-words``'s value: ``"3 1;5"`` -> ``((3, 1), (5,))`` (words separated by ``;``, a word's token ids by
    spaces)."""
    words = []
    for item in text.split(";"):
        try:
            words.append(tuple(int(t) for t in item.split()))
        except ValueError:
            raise ValueError(f"bad word {item!r} is not token ids separated by spaces") from None
        if not words[-1]:
            raise ValueError(f"bad words {text!r}: an empty word (words are separated by ';')")
    return tuple(words)


def setting_text(value, name: str | None = None) -> str:
    """A setting's value as its flag takes it (``logit_bias`` pairs as ``3:2.5,5:-1``, ``bad_words`` as ``3 1;5``,
    an automaton as compact JSON)."""
    if name == "bad_words":
        return ";".join(" ".join(str(t) for t in w) for w in value)
    if hasattr(value, "transitions"):
        import json

        return json.dumps(value.as_dict(), separators=(",", ":"))
    if isinstance(value, tuple):
        return ",".join(f"{int(t)}:{b:g}" for t, b in value)
    return f"{value:g}"


#: The history-dependent and min-p settings the certify command accepts: (flag, SamplingConfig field, type, off value).
_EXTRA_SETTINGS = (
    ("--min-p", "min_p", float, None),
    ("--repetition-penalty", "repetition_penalty", float, 1.0),
    ("--presence-penalty", "presence_penalty", float, 0.0),
    ("--frequency-penalty", "frequency_penalty", float, 0.0),
    ("--min-new-tokens", "min_new_tokens", int, 0),
    ("--logit-bias", "logit_bias", parse_logit_bias, ()),
    ("--automaton", "constraint", parse_automaton, None),
    ("--bad-words", "bad_words", parse_bad_words, ()),
)


def extra_settings_on(sampling: SamplingConfig) -> list[tuple[str, str, object]]:
    """``(flag, field, value)`` of every :data:`_EXTRA_SETTINGS` entry the settings turn on (min-p not under greedy)."""
    return [(flag, name, getattr(sampling, name)) for flag, name, _, off in _EXTRA_SETTINGS
            if getattr(sampling, name) != off and not (sampling.greedy and name == "min_p")]


def _settings_label(sampling: SamplingConfig, eos_id: int | None, stop=None) -> str:
    if sampling.greedy:
        parts = ["greedy"]
    else:
        parts = [f"temperature={sampling.temperature:g}"]
        if sampling.top_k is not None:
            parts.append(f"top_k={sampling.top_k}")
        if sampling.top_k_ties != "all":
            parts.append(f"top_k_ties={sampling.top_k_ties}")
        if sampling.top_p is not None:
            parts.append(f"top_p={sampling.top_p:g}")
    parts += [f"{name}={setting_text(value, name)}" for _, name, value in extra_settings_on(sampling)]
    parts.append(f"eos_id={eos_id}" if eos_id is not None else "no EOS stop")
    if stop is not None:
        parts.append(stop.label())
    return ", ".join(parts)


def _law(model, prompt, n: int, sampling: SamplingConfig, eos_id: int | None, stop=None):
    """The law of the first ``n`` tokens (``stop``: a :class:`specdec_properties.stops.StopStrings`, a leaf like EOS)."""
    return continuation_law(model, list(prompt), n, sampling, eos_id=eos_id, stop=stop)


def _power_at(law, n: int, alpha: float, tv: float) -> tuple[float, int]:
    """(power of the test of ``law`` with ``n`` samples against ``tv``, df), pooling as goodness_of_fit does."""
    probs = np.asarray(list(law.values()) + ([law.pruned_mass] if law.pruned_mass > 0 else []), dtype=np.float64)
    small = (probs > 0) & (probs * n < MIN_EXPECTED)
    df = int(np.count_nonzero(probs > 0) - small.sum()) - (0 if small.any() else 1)
    return power_against_tv(n, max(df, 0), alpha, tv - float(probs[small].sum())), df


def choose_length(model, prompt, n: int, sampling: SamplingConfig, *, max_new_tokens: int, eos_id: int | None,
                  alpha: float = ALPHA, tv: float = SAMPLES_TV, max_cells: int = MAX_CELLS, stop=None) -> tuple[int, str]:
    """``(L, why)``: the largest L <= max_new_tokens whose test still has power 0.99 against ``tv`` with ``n`` samples.

    Each extra token multiplies the cells; the pooled small cells and the extra degrees of freedom
    cost power. L = 1 when even one token cannot reach it (its power is then stated as is); the
    enumeration also stops at ``max_cells`` continuations.
    """
    chosen, why = 1, ""
    for length in range(1, max_new_tokens + 1):
        law = _law(model, prompt, length, sampling, eos_id, stop)
        if len(law) > max_cells and length > 1:
            why = f"L={length} would have {len(law)} continuations (> {max_cells})"
            break
        if length > 1 and split_ties(model, prompt, length, sampling, eos_id=eos_id, stop=stop):
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
        if all(len(seq) < length or (eos_id is not None and seq[-1] == eos_id) or (stop is not None and stop(seq))
               for seq in law) and length > 1:
            why = f"every continuation ends with EOS{' or a stop string' if stop is not None else ''} by L={length}"
            break
    else:
        why = f"L reaches max_new_tokens {max_new_tokens}"
    return chosen, why


def split_ties(model, prompt, n: int, sampling: SamplingConfig, *, eos_id: int | None, stop=None) -> list[str]:
    """Rows of the law where the warped support splits a group of exactly tied logits (empty: the law is well defined).

    Which tied tokens top-k keeps is declared (``sampling.top_k_ties``), but a top-p cut can fall inside a tie
    group: then *which* tied tokens survive depends on how the sampler sorts equal values (``torch.sort``
    descending keeps the lowest ids, transformers' ascending ``TopPLogitsWarper`` the highest), so the law is
    not determined by the settings (:func:`specdec_properties.transitions.tie_split_mask`). Ties are judged on each prefix's processed logits (history-dependent
    settings applied on its own history, :func:`specdec_properties.sequences.processed_logits64`), the logits the
    cut actually sees. One line per such prefix (generated tokens so far, kept and cut tokens).
    """
    if sampling.greedy:
        return []
    from specdec_properties.sequences import processed_logits64
    from specdec_properties.transitions import tie_split_mask
    from specdec_ref.warp import warp

    law = _law(model, prompt, n, sampling, eos_id, stop)
    prefixes = sorted({seq[:i] for seq in law for i in range(len(seq))})
    rows = processed_logits64(model, list(prompt), prefixes, sampling, eos_id=eos_id)
    kept = warp(rows, sampling, dtype=torch.float64) > 0
    tied_out_mask = tie_split_mask(rows, sampling)
    problems = []
    for prefix, z, keep, out in zip(prefixes, rows, kept, tied_out_mask):
        if not out.any():
            continue
        lowest_kept = float(z[keep].min())
        tied_out = [int(t) for t in torch.nonzero(out).flatten()]
        tied_in = [int(t) for t in torch.nonzero(keep & (z == lowest_kept)).flatten()]
        problems.append(
            f"after {show_ids(list(prompt) + list(prefix))}: tokens {tied_in} and {tied_out} have the same logit "
            f"{lowest_kept:g}; the cut keeps {tied_in} and drops {tied_out}"
        )
    return problems
