"""Input validation for the verifier: a clear ``ValueError`` instead of a silent wrong answer.

Validation reads tensor values back to the host, so it synchronises; the
reference runs it by default and lets callers switch it off for speed
(``verify_block(..., validate=False)``).
"""
from __future__ import annotations

import torch

#: ``|sum(probs) - 1|`` allowed per row, by dtype. Low-precision rows sum to 1
#: only up to rounding of V terms; float32 softmax of a 256k vocabulary stays
#: well inside 1e-3.
SUM_TOLERANCE = {
    torch.float64: 1e-6,
    torch.float32: 1e-3,
    torch.float16: 2e-2,
    torch.bfloat16: 2e-2,
}

_FLOAT_DTYPES = tuple(SUM_TOLERANCE)


def distinct_values(t: torch.Tensor) -> torch.Tensor:
    """``t`` with every broadcast dimension (stride 0, e.g. from ``expand``) cut to size 1: the same values, each read
    once; the first index of any value in row-major order is the same in both (it is 0 along those dimensions)."""
    if 0 not in t.stride():
        return t
    return t[tuple(slice(0, 1) if stride == 0 and size > 1 else slice(None) for stride, size in zip(t.stride(), t.shape))]


def check_probs(name: str, probs: torch.Tensor, shape: tuple[int, ...]) -> None:
    if probs.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be a floating tensor (float64/32/16, bfloat16), got dtype {probs.dtype}")
    if tuple(probs.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(probs.shape)}")
    probs = distinct_values(probs)  # an expanded batch of one row is checked once
    tol = SUM_TOLERANCE[probs.dtype]
    acc = torch.float64 if probs.dtype == torch.float64 else torch.float32
    sums = probs.sum(-1, dtype=acc)
    # fast path, one host sync: a NaN makes amin NaN, an infinity makes a row sum non-finite
    ok = (probs.amin() >= 0) & ((sums - 1).abs() <= tol).all()
    if bool(ok):
        return
    finite = torch.isfinite(probs)
    if not bool(finite.all()):
        where = (~finite).nonzero()[0].tolist()
        raise ValueError(f"{name} contains NaN or infinity, first at index {tuple(where)}")
    negative = probs < 0
    if bool(negative.any()):
        where = negative.nonzero()[0].tolist()
        raise ValueError(
            f"{name} contains negative probabilities, first at index {tuple(where)}: {probs[tuple(where)].item()!r}"
        )
    bad = ~((sums - 1).abs() <= tol)
    where = bad.nonzero()[0].tolist()
    raise ValueError(
        f"{name} rows must sum to 1 within {tol:g} for {probs.dtype}; row {tuple(where)} sums to {sums[tuple(where)].item()!r}"
    )


def validate_verify_inputs(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
) -> None:
    """Check shapes, dtypes, k/V consistency, token ranges and probability rows.

    Raises ValueError naming the argument and the problem.
    """
    if not isinstance(draft_tokens, torch.Tensor):
        raise ValueError(f"draft_tokens must be a torch.Tensor, got {type(draft_tokens).__name__}")
    if not isinstance(target_probs, torch.Tensor):
        raise ValueError(f"target_probs must be a torch.Tensor, got {type(target_probs).__name__}")
    if draft_tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"draft_tokens must be an integer tensor (int64 or int32), got dtype {draft_tokens.dtype}")
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must have shape [B, k], got {tuple(draft_tokens.shape)}")
    batch, k = draft_tokens.shape
    if batch < 1:
        raise ValueError("draft_tokens has batch size 0; B must be >= 1")
    if k < 1:
        raise ValueError(f"k must be >= 1 (draft_tokens has shape {tuple(draft_tokens.shape)})")
    if target_probs.dim() != 3:
        raise ValueError(f"target_probs must have shape [B, k+1, V], got {tuple(target_probs.shape)}")
    vocab = target_probs.shape[-1]
    if vocab < 1:
        raise ValueError("target_probs has an empty vocabulary (V = 0)")
    check_probs("target_probs", target_probs, (batch, k + 1, vocab))
    if draft_probs is not None:
        if not isinstance(draft_probs, torch.Tensor):
            raise ValueError(f"draft_probs must be a torch.Tensor or None, got {type(draft_probs).__name__}")
        if draft_probs.dim() == 3 and draft_probs.shape[-1] != vocab:
            raise ValueError(
                f"vocabulary mismatch: draft_probs has V={draft_probs.shape[-1]}, target_probs has V={vocab}"
            )
        check_probs("draft_probs", draft_probs, (batch, k, vocab))
        if draft_probs.device != target_probs.device:
            raise ValueError(f"draft_probs is on {draft_probs.device}, target_probs on {target_probs.device}")
    if draft_tokens.device != target_probs.device:
        raise ValueError(f"draft_tokens is on {draft_tokens.device}, target_probs on {target_probs.device}")
    out = (draft_tokens < 0) | (draft_tokens >= vocab)
    if bool(out.any()):
        where = out.nonzero()[0].tolist()
        raise ValueError(
            f"draft_tokens must be in [0, {vocab}); draft_tokens{tuple(where)} = {draft_tokens[tuple(where)].item()}"
        )
