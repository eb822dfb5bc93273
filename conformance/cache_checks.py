"""Conformance of a backend's KV cache (``backend.make_cache(model)``, the ModelCache interface).

A Hypothesis state machine (``specdec_properties.stateful_cache``) appends tokens and
blocks, trims to chosen points (0 and the current length included), commits and
reads logits, and after every step compares every layer's keys and values
with a fresh prefill of the token list it modelled in plain Python.
"""
from __future__ import annotations

from hypothesis import settings

from specdec_properties.stateful_cache import run_cache_machine

from .check_helpers import model_pair
from .registry import CheckContext, check


@check(
    guards="off-by-one trims, crop(0) no-ops, a layer left untrimmed, stale position ids, commit keeping the tentative tail",
    requires=("cache",),
    cases=[(arch, {"arch": arch}) for arch in ("llama", "qwen2", "gpt2")],
)
def check_cache_matches_fresh_prefill_under_random_operations(backend, ctx: CheckContext, arch: str):
    """After any sequence of feed / trim / commit / reset, every layer's K/V equals a fresh prefill of the kept tokens."""
    target, _ = model_pair(arch, "identical")
    run_cache_machine(
        lambda: backend.make_cache(target),
        target,
        settings=settings(max_examples=max(8, settings().max_examples // 6), stateful_step_count=15),
    )
