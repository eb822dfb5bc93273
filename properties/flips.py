"""Greedy divergence classifier: *numerical flip* (report) or *algorithmic divergence* (fail).

Speculative greedy decoding must reproduce target-only (AR) greedy decoding token for token in
exact arithmetic. In floating point the block-verify forward and the one-token forward use
different kernels and reduction orders, and a model run in bfloat16 differs from its float64
self by far more than that; when the top-1 and top-2 logits are nearly tied, either token can be
the argmax. At the first differing position we therefore recompute the target's next-token
logits in float64 (a full forward with no cache, by a float64 copy of the model) and ask whether
*both* emitted tokens lie within a stated tolerance of the float64 maximum logit:

* yes -> ``"numerical_flip"``: either token can be the argmax under the rounding of the dtype
  under test; report it (the sequences legitimately part ways here);
* no  -> ``"algorithmic_divergence"``: one of the tokens is clearly not the argmax; a real bug.

A sequence that *ends* early (no token where the other has one) is always an algorithmic
divergence (a length / EOS / max-length bug): rounding cannot stop a decoder.

Tolerances
----------
The tolerance is *relative to the logit scale* of the row, ``max_x |z64(x)|`` (the error of a model run in a low
precision grows with the size of its logits); the absolute tolerance at a position is::

    tolerance_for(dtype, logits_scale=s) = TOLERANCE[dtype] * max(s, 1.0)

(the floor of 1 keeps a sane tolerance for near-uniform rows whose logits cancel). :data:`TOLERANCE` is 4x the
largest relative *gap error* (``max_x err(x) - min_x err(x)``, ``err = z_dtype - z64``) measured per dtype on the
tiny models and the trained pair, block and step paths; the measurement and its table are in docs/statistics.md
("Greedy: numerical flips"), reproduced by ``python -m specdec_properties.flips``. On a GPU with TF32 matmuls, "float32" has a
10-bit mantissa like float16: classify with ``dtype_under_test=torch.float16`` (or pass an explicit ``tolerance``). A
model may carry its own measured relative tolerances as ``model.specdec_flip_tolerance = {dtype: rel}``
(:func:`tolerance_for` prefers them).

The float64 logits come from :func:`specdec_ref.forward.reference_logits`, whose float64 copy of
each model is cached (keyed weakly by the model, invalidated when its
:func:`~specdec_ref.forward.weights_fingerprint` changes), so classifying many divergences does
not re-copy the model.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch

from specdec_ref.forward import as_prompt, cache_arg, model_copy, reference_logits, token_list

__all__ = [
    "TOLERANCE",
    "DEFAULT_LOGITS_SCALE",
    "NUMERICAL_FLIP",
    "ALGORITHMIC_DIVERGENCE",
    "FlipVerdict",
    "LogitError",
    "first_divergence",
    "tolerance_for",
    "high_precision_model",
    "high_precision_logits",
    "classify_divergence",
    "classify_sequences",
    "measure_logit_error",
]

NUMERICAL_FLIP = "numerical_flip"
ALGORITHMIC_DIVERGENCE = "algorithmic_divergence"

#: Relative logit tolerance per dtype under test: the absolute tolerance at a position is
#: ``TOLERANCE[dtype] * max(1, max_x |z64(x)|)``. 4x the largest measured relative gap error
#: (module docstring table).
TOLERANCE: dict[torch.dtype, float] = {
    torch.float32: 1.1e-5,
    torch.bfloat16: 0.16,
    torch.float16: 0.026,
}
#: Logit scale assumed by :func:`tolerance_for` when neither a scale nor a model override is
#: known: covers every measured model (max |logit| 27.2).
DEFAULT_LOGITS_SCALE = 32.0


# --------------------------------------------------------------------------- helpers


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ, ``None`` if they are equal.

    Sequences of different lengths whose common part agrees diverge at the shorter one's length
    (there the shorter one has no token: ``None``). Accepts lists, tuples and 1-d / ``[1, n]``
    tensors.
    """
    a, b = token_list(a), token_list(b)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    if len(a) != len(b):
        return min(len(a), len(b))
    return None


def _dtype_key(dtype) -> torch.dtype:
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
        dtype = getattr(torch, name, None)
    if dtype not in TOLERANCE:
        raise ValueError(f"no measured tolerance for dtype {dtype!r}; known: {sorted(map(str, TOLERANCE))}")
    return dtype


def tolerance_for(dtype: torch.dtype, model: torch.nn.Module | None = None, logits_scale: float | None = None) -> float:
    """Absolute logit tolerance for a flip under ``dtype``: ``rel * max(1, logits_scale)``.

    ``rel`` is ``model.specdec_flip_tolerance[dtype]`` when the model carries one, else
    :data:`TOLERANCE` ``[dtype]``. ``logits_scale`` is the row's ``max |logit|`` (float64);
    without it :data:`DEFAULT_LOGITS_SCALE` is assumed.
    """
    dtype = _dtype_key(dtype)
    rel = TOLERANCE[dtype]
    override = getattr(model, "specdec_flip_tolerance", None) if model is not None else None
    if override:
        for key, value in override.items():
            if _dtype_key(key) == dtype:
                rel = float(value)
    scale = DEFAULT_LOGITS_SCALE if logits_scale is None else float(logits_scale)
    if not math.isfinite(scale):
        raise ValueError(f"logits_scale must be finite, got {logits_scale!r}")
    return rel * max(abs(scale), 1.0)


# --------------------------------------------------------------------------- float64 oracle


def high_precision_model(model: torch.nn.Module) -> torch.nn.Module:
    """The cached float64 copy of ``model``: :func:`specdec_ref.forward.model_copy` ``(model, float64)``."""
    return model_copy(model, torch.float64)


def high_precision_logits(model: torch.nn.Module, ids) -> torch.Tensor:
    """``[B, n, V]`` float64 logits of ``ids``: :func:`specdec_ref.forward.reference_logits` in float64."""
    return reference_logits(model, ids, dtype=torch.float64)


# --------------------------------------------------------------------------- verdict


@dataclass(frozen=True)
class FlipVerdict:
    """The classification of one greedy divergence (``token_a`` vs ``token_b`` after ``prefix``).

    Logit fields are float64 target logits at the next position after ``prefix``; ``None`` where a
    token is missing (one sequence ended early). ``rank`` 0 is the float64 argmax (first index on
    exact ties). ``tolerance`` is the absolute logit tolerance used.
    """

    prefix: list[int]
    token_a: int | None
    token_b: int | None
    logit_a: float | None
    logit_b: float | None
    rank_a: int | None
    rank_b: int | None
    top1: float
    top2: float
    top1_token: int
    top2_token: int
    gap_top1_top2: float
    gap_between: float | None
    logits_scale: float
    tolerance: float
    dtype: str
    kind: str
    position: int | None = None
    labels: tuple[str, str] = ("a", "b")
    note: str = field(default="")

    @property
    def is_numerical_flip(self) -> bool:
        return self.kind == NUMERICAL_FLIP

    @property
    def is_bug(self) -> bool:
        return self.kind == ALGORITHMIC_DIVERGENCE

    def describe(self, tail: int = 8) -> str:
        """One readable paragraph: where, which tokens, both gaps, the tolerance and the verdict."""
        la, lb = self.labels
        shown = self.prefix[-tail:]
        dots = "... " if len(self.prefix) > tail else ""
        where = f"at position {self.position} " if self.position is not None else ""
        head = (
            f"Greedy divergence {where}after prefix [{dots}{' '.join(map(str, shown))}] "
            f"(length {len(self.prefix)}): {la} emitted {_tok(self.token_a)}, {lb} emitted {_tok(self.token_b)}. "
        )
        if self.token_a is None or self.token_b is None:
            missing = la if self.token_a is None else lb
            return head + (
                f"The {missing} sequence ended early with no token here; rounding cannot end a sequence, "
                f"so this is an ALGORITHMIC DIVERGENCE (length / EOS / max-length bug). "
                f"float64 argmax here is {self.top1_token} (logit {self.top1:.6g})."
            )
        verdict = (
            "NUMERICAL FLIP (both tokens are within tolerance of the float64 maximum: either can be the "
            f"argmax under {self.dtype} rounding; reported, not a failure)"
            if self.is_numerical_flip
            else "ALGORITHMIC DIVERGENCE (a token is clearly below the float64 maximum: a real bug)"
        )
        return head + (
            f"float64 logits: {la} token {self.token_a} = {self.logit_a:.6g} (rank {self.rank_a}), "
            f"{lb} token {self.token_b} = {self.logit_b:.6g} (rank {self.rank_b}); "
            f"gap between them {self.gap_between:.3g}; top-1/top-2 gap {self.gap_top1_top2:.3g} "
            f"(top-1 token {self.top1_token} = {self.top1:.6g}, top-2 token {self.top2_token} = {self.top2:.6g}); "
            f"tolerance {self.tolerance:.3g} for {self.dtype} at logit scale {self.logits_scale:.3g}. "
            f"Verdict: {verdict}." + (f" {self.note}" if self.note else "")
        )

    def as_record(self) -> dict:
        """A JSON-serialisable dict of every field plus ``describe()``."""
        record = asdict(self)
        record["labels"] = list(self.labels)
        record["description"] = self.describe()
        return record

    def with_position(self, position: int | None) -> "FlipVerdict":
        import dataclasses

        return dataclasses.replace(self, position=position)


def _tok(t) -> str:
    return "<end of sequence>" if t is None else f"token {t}"


def classify_divergence(
    target_model: torch.nn.Module,
    prefix,
    token_a: int | None,
    token_b: int | None,
    *,
    tolerance: float | None = None,
    dtype_under_test: torch.dtype = torch.float32,
    position: int | None = None,
    labels: tuple[str, str] = ("a", "b"),
) -> FlipVerdict:
    """Classify two greedy choices ``token_a`` / ``token_b`` made after ``prefix``.

    ``prefix``: ``LongTensor[1, t]`` / ``[t]`` or a list of ids (prompt plus the common tokens).
    The target's next-token logits are recomputed in float64 (full forward, no cache). Verdict
    ``"numerical_flip"`` iff both tokens are within ``tolerance`` of the float64 max logit;
    ``tolerance=None`` uses :func:`tolerance_for` ``(dtype_under_test, target_model, row scale)``.
    A ``None`` token (sequence ended) is always ``"algorithmic_divergence"``.
    """
    prefix_list = token_list(prefix)
    if not prefix_list:
        raise ValueError("prefix must hold at least one token (the prompt)")
    z = high_precision_logits(target_model, [prefix_list])[0, -1].cpu()  # judged on the host (a CUDA model's logits too)
    vocab = z.shape[-1]
    for name, t in (("token_a", token_a), ("token_b", token_b)):
        if t is not None and not 0 <= int(t) < vocab:
            raise ValueError(f"{name}={t} is outside the vocabulary [0, {vocab})")
    # rank: number of tokens strictly better, ties broken by index (first-index argmax convention)
    order = torch.argsort(-z, stable=True)
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(vocab)
    top1_token, top2_token = int(order[0]), int(order[1]) if vocab > 1 else int(order[0])
    top1, top2 = float(z[top1_token]), float(z[top2_token])
    scale = float(z.abs().max())
    tol = tolerance_for(dtype_under_test, target_model, scale) if tolerance is None else float(tolerance)
    if tol < 0 or not math.isfinite(tol):
        raise ValueError(f"tolerance must be finite and >= 0, got {tol!r}")

    def logit(t):
        return None if t is None else float(z[int(t)])

    def rank(t):
        return None if t is None else int(ranks[int(t)])

    la, lb = logit(token_a), logit(token_b)
    if la is None or lb is None:
        kind = ALGORITHMIC_DIVERGENCE
        gap_between = None
    else:
        gap_between = abs(la - lb)
        kind = NUMERICAL_FLIP if max(top1 - la, top1 - lb) <= tol else ALGORITHMIC_DIVERGENCE
    return FlipVerdict(
        prefix=prefix_list,
        token_a=None if token_a is None else int(token_a),
        token_b=None if token_b is None else int(token_b),
        logit_a=la,
        logit_b=lb,
        rank_a=rank(token_a),
        rank_b=rank(token_b),
        top1=top1,
        top2=top2,
        top1_token=top1_token,
        top2_token=top2_token,
        gap_top1_top2=top1 - top2,
        gap_between=gap_between,
        logits_scale=scale,
        tolerance=tol,
        dtype=str(_dtype_key(dtype_under_test)),
        kind=kind,
        position=position,
        labels=tuple(labels),
    )


def classify_sequences(
    target_model: torch.nn.Module,
    prompt,
    spec_tokens: Sequence[int],
    ar_tokens: Sequence[int],
    *,
    dtype_under_test: torch.dtype = torch.float32,
    tolerance: float | None = None,
) -> FlipVerdict | None:
    """Classify the first divergence of two greedy continuations of ``prompt`` (``None`` if equal).

    ``spec_tokens`` / ``ar_tokens`` are the generated tokens only (without the prompt). The
    verdict's ``position`` indexes the continuation; its prefix is ``prompt + common tokens``;
    token a is the speculative one, token b the AR one.
    """
    spec, ar = token_list(spec_tokens), token_list(ar_tokens)
    i = first_divergence(spec, ar)
    if i is None:
        return None
    prefix = token_list(prompt) + spec[:i]
    tok_s = spec[i] if i < len(spec) else None
    tok_a = ar[i] if i < len(ar) else None
    return classify_divergence(
        target_model,
        prefix,
        tok_s,
        tok_a,
        tolerance=tolerance,
        dtype_under_test=dtype_under_test,
        position=i,
        labels=("speculative", "AR"),
    )


# --------------------------------------------------------------------------- measurement


@dataclass
class LogitError:
    """Low-precision vs float64 logit errors of one model over some positions.

    Per row (position): ``abs_err`` = max_x |err(x)|, ``gap_err`` = max_x err(x) - min_x err(x)
    (bounds the error of every logit difference), ``scale`` = max_x |z64(x)|.
    """

    dtype: str
    mode: str
    abs_err: torch.Tensor
    gap_err: torch.Tensor
    scale: torch.Tensor

    @property
    def positions(self) -> int:
        return int(self.abs_err.numel())

    @property
    def max_abs(self) -> float:
        return float(self.abs_err.max())

    @property
    def max_gap(self) -> float:
        return float(self.gap_err.max())

    @property
    def max_gap_rel(self) -> float:
        return float((self.gap_err / self.scale.clamp_min(1.0)).max())

    @property
    def max_scale(self) -> float:
        return float(self.scale.max())


def _low_precision_logits(model, dtype, ids, mode):
    from transformers import DynamicCache

    if mode == "block":
        return reference_logits(model, ids, dtype=dtype).to(torch.float64)
    low = model_copy(model, dtype)
    with torch.no_grad():
        cache = DynamicCache(config=low.config)
        rows = []
        for i in range(ids.shape[1]):
            out = low(input_ids=ids[:, i : i + 1], position_ids=torch.tensor([[i]]), **cache_arg(low, cache), use_cache=True)
            rows.append(out.logits[:, -1].to(torch.float64))
        return torch.stack(rows, 1)


def measure_logit_error(model: torch.nn.Module, dtype: torch.dtype, prompts, *, mode: str = "both") -> LogitError:
    """Errors of ``model`` cast to ``dtype`` against its float64 copy, over every position of ``prompts``.

    ``mode``: ``"block"`` (one forward of the whole prompt), ``"step"`` (token by token with a
    ``DynamicCache``) or ``"both"`` (rows of both). ``prompts``: iterable of ``[1, n]`` id tensors.
    """
    modes = ("block", "step") if mode == "both" else (mode,)
    abs_err, gap_err, scale = [], [], []
    for ids in prompts:
        ids = as_prompt(ids)
        ref = high_precision_logits(model, ids)[0]
        for m in modes:
            err = _low_precision_logits(model, dtype, ids, m)[0] - ref
            abs_err.append(err.abs().max(-1).values)
            gap_err.append(err.max(-1).values - err.min(-1).values)
            scale.append(ref.abs().max(-1).values)
    return LogitError(str(dtype), mode, torch.cat(abs_err), torch.cat(gap_err), torch.cat(scale))


def _measurement_models():
    from specdec_ref.models import tiny_lm

    g = torch.Generator().manual_seed(7)
    tiny_prompts = [torch.randint(0, 16, (1, 100), generator=g) for _ in range(5)]
    for arch in ("llama", "qwen2", "gpt2"):
        for scale in (1.0, 4.0):
            yield f"tiny {arch} s={scale:g}", tiny_lm(arch, seed=0, init_scale=scale), tiny_prompts
    try:
        from specdec_ref.pretrained import load_trained_pair, sample_prompts
    except ImportError:  # pragma: no cover - the pair is optional here
        return
    target, draft = load_trained_pair()
    prompts = sample_prompts(5, length=100, seed=0)
    yield "pair target", target, prompts
    yield "pair draft", draft, prompts


def main() -> None:  # pragma: no cover - reproduces the docstring table
    torch.set_num_threads(1)
    print(f"{'model':22s} {'dtype':15s} {'pos':>5s} {'max|z|':>7s} {'max abs':>9s} {'max gap':>9s} {'gap/|z|':>9s}  tolerance ok")
    for name, model, prompts in _measurement_models():
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            e = measure_logit_error(model, dtype, prompts)
            ok = bool((e.gap_err <= TOLERANCE[dtype] * e.scale.clamp_min(1.0)).all())
            print(
                f"{name:22s} {str(dtype):15s} {e.positions:5d} {e.max_scale:7.1f} {e.max_abs:9.2e} "
                f"{e.max_gap:9.2e} {e.max_gap_rel:9.2e}  {TOLERANCE[dtype]:g} {ok}"
            )


if __name__ == "__main__":  # pragma: no cover
    main()
