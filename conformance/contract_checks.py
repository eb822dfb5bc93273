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


def _assert_unclaimed_modes_raise(backend, method: str, call) -> None:
    """``call(probs_or_none)`` in each mode the backend does not claim must raise NotSupportedError (or NotImplementedError)."""
    drafts, draft, target = _block()
    for mode, probs in (("sampling", draft), ("greedy", None)):
        if backend.capabilities.has(mode):
            continue
        try:
            out = call(drafts, probs, target)
        except (NotSupportedError, NotImplementedError):
            continue
        raise AssertionError(
            f"backend {backend.name!r} does not claim {mode!r} but {method}() in {mode} mode returned {out!r} "
            f"instead of raising specdec_ref.contract.NotSupportedError"
        )


@check(
    guards="a backend answering requests for a capability it does not claim (uncertified results passed off as supported)",
    requires=("verifier",),
)
def check_unclaimed_modes_raise_not_supported(backend, ctx: CheckContext):
    """verify() in a mode the backend does not claim (sampling: draft_probs given; greedy: None) raises NotSupportedError."""
    _assert_unclaimed_modes_raise(
        backend, "verify", lambda d, q, p: backend.verify(d, q, p, generator=torch.Generator().manual_seed(1))
    )


@check(
    guards="a tree verifier answering requests for a mode it does not claim (uncertified results passed off as supported)",
    requires=("tree",),
)
def check_tree_unclaimed_modes_raise_not_supported(backend, ctx: CheckContext):
    """verify_tree() in a mode the backend does not claim (sampling: draft_probs given; greedy: None) raises NotSupportedError."""

    def call(drafts, probs, target):
        chain = torch.arange(drafts.shape[1])[None, :] - 1  # a chain: parents [-1, 0, 1]
        return backend.verify_tree(drafts, chain, probs, target, generator=torch.Generator().manual_seed(1))

    _assert_unclaimed_modes_raise(backend, "verify_tree", call)
