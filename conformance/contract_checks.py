"""Conformance of the capability declaration itself: unclaimed means unsupported, loudly.

A backend that does not claim ``sampling`` (or ``greedy``) must raise
``specdec_ref.contract.NotSupportedError`` (or ``NotImplementedError``) when
asked for it, never return a result nobody certified. Claimed capabilities are
held to their checks by the other check families.
"""
from __future__ import annotations

import torch

from specdec_ref.contract import NotSupportedError

from .registry import CheckContext, check


def _block():
    gen = torch.Generator().manual_seed(0)
    target = torch.softmax(torch.randn(1, 4, 8, generator=gen), -1)
    draft = torch.softmax(torch.randn(1, 3, 8, generator=gen), -1)
    drafts = torch.multinomial(draft[0], 1, generator=gen).T
    return drafts, draft, target


@check(
    guards="a backend answering requests for a capability it does not claim (uncertified results passed off as supported)",
    requires=("verifier",),
)
def check_unclaimed_modes_raise_not_supported(backend, ctx: CheckContext):
    """verify() in a mode the backend does not claim (sampling: draft_probs given; greedy: None) raises NotSupportedError."""
    drafts, draft, target = _block()
    for mode, probs in (("sampling", draft), ("greedy", None)):
        if backend.capabilities.has(mode):
            continue
        try:
            out = backend.verify(drafts, probs, target, generator=torch.Generator().manual_seed(1))
        except (NotSupportedError, NotImplementedError):
            continue
        raise AssertionError(
            f"backend {backend.name!r} does not claim {mode!r} but verify() in {mode} mode returned {out!r} "
            f"instead of raising specdec_ref.contract.NotSupportedError"
        )
