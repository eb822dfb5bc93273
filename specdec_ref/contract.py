"""The backend contract: what a speculative-decoding backend exposes and declares.

The block verifier (FlashInfer's shapes)::

    verify(draft_tokens: Long[B, k],
           draft_probs: Float[B, k, V] | None,
           target_probs: Float[B, k+1, V],
           *, generator: torch.Generator | None = None)
        -> (num_accepted: Long[B], tokens: Long[B, k+1])

* ``target_probs[:, i]`` is the target distribution for the position of
  ``d_{i+1}``: row 0 is ``saved_next`` (the target's distribution before the
  block), row ``i`` the distribution after seeing ``d_i``; row ``k`` is the
  bonus row used when all ``k`` drafts are accepted.
* ``draft_probs[:, i]`` is exactly the distribution ``d_{i+1}`` was drawn from
  (after temperature / top-k / top-p).
* ``draft_probs is None`` means greedy: accept ``d_i`` while it is the target's
  greedy choice for its row; the replacement (or the bonus) is that choice.
  The reference uses ``torch.argmax`` semantics (first maximal index), so it
  reproduces plain autoregressive greedy decoding exactly. The conformance
  check accepts any *valid greedy path*: every accepted draft and the final
  emitted token are maximisers of their rows, and acceptance never goes past a
  draft token that is not a maximiser. Exact ties are not held against a
  backend that breaks them differently.
* Output: ``m = num_accepted[b]`` with ``0 <= m <= k``; ``tokens[b, :m]`` are
  the accepted drafts, ``tokens[b, m]`` is the replacement (a sample of the
  residual ``[p - q]_+``) or the bonus, ``tokens[b, m+1:] == -1``.
* Randomness comes only from ``generator`` when one is given.

A backend is any object with ``name``, ``version``, ``capabilities`` and the
methods its capabilities claim (``verify`` for ``verifier``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

PAD_TOKEN = -1

#: Capability flags a backend may claim. Checks are marked with the flags they
#: need; an unknown flag name is an error at collection time.
CAPABILITY_FLAGS = (
    "verifier",  # exposes verify()
    "greedy",  # verify(draft_probs=None) / greedy decoding
    "sampling",  # rejection-sampling verification / sampled decoding
    "batched",  # B > 1 in one call
    "cache",  # exposes a KV cache with trim (see specdec_ref.cache)
    "decoder",  # exposes a full speculative decoder
    "top_k",  # decoder honours top-k
    "top_p",  # decoder honours top-p
)


DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")
DEVICE_NAMES = ("cpu", "cuda")


def check_requirement(flag: str) -> None:
    """Raise ValueError for a requirement that is neither a capability flag nor ``dtype:``/``device:`` + a known name."""
    kind, sep, name = flag.partition(":")
    if flag in CAPABILITY_FLAGS or (kind == "dtype" and name in DTYPE_NAMES) or (kind == "device" and name in DEVICE_NAMES):
        return
    raise ValueError(
        f"unknown capability {flag!r}; known: {', '.join(CAPABILITY_FLAGS)}, "
        f"dtype:{{{','.join(DTYPE_NAMES)}}}, device:{{{','.join(DEVICE_NAMES)}}}"
    )


class NotSupportedError(NotImplementedError):
    """Raised by a backend asked for something it does not claim to support."""


@dataclass(frozen=True)
class Capabilities:
    """A backend's frozen declaration of what it supports.

    A check that needs an unclaimed capability is skipped, naming it; a claimed
    capability must pass every check that needs it.
    """

    verifier: bool = True
    greedy: bool = True
    sampling: bool = True
    batched: bool = True
    cache: bool = False
    decoder: bool = False
    top_k: bool = False
    top_p: bool = False
    dtypes: tuple[str, ...] = ("float32",)
    devices: tuple[str, ...] = ("cpu",)
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def has(self, flag: str) -> bool:
        """A capability flag, or ``dtype:NAME`` / ``device:NAME`` (claimed in ``dtypes`` / ``devices``)."""
        check_requirement(flag)
        kind, _, name = flag.partition(":")
        if kind == "dtype" and name:
            return name in self.dtypes
        if kind == "device" and name:
            return name in self.devices
        return bool(getattr(self, flag))

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("extra")
        return d


@runtime_checkable
class VerifierBackend(Protocol):
    name: str
    version: str
    capabilities: Capabilities

    def verify(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
