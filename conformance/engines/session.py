"""The session plumbing adapters share: requests routed to an engine instance per EOS variant, a thread pool, the
engine's own refusals, and closing.

Engines that cannot make EOS an ordinary token load a second export of the checkpoint in which token 7 is an
ordinary word and EOS a never-sampled extra id: the ``plain`` variant (requests that ignore EOS) beside ``eos``
(requests that stop at it). :class:`VariantSession` holds one instance per variant, loaded on first use, sends each
request to its variant's instance and returns the records in request order. An adapter's session subclasses it and
implements :meth:`~VariantSession.load` and :meth:`~VariantSession.one` (or :meth:`~VariantSession.generate_variant`
when its engine takes a whole batch); everything else has a default.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

__all__ = ["VARIANTS", "variant_of", "VariantSession"]

#: The exports a variant session may load: EOS stops the request, or EOS is an ordinary token.
VARIANTS = ("eos", "plain")


def variant_of(request) -> str:
    """``eos`` when EOS stops the request, ``plain`` when EOS is an ordinary token."""
    return "eos" if request.eos else "plain"


class VariantSession:
    """A :class:`conformance.engines.adapter.EngineSession` over one engine instance per variant (see the module).

    ``threads``: requests of one variant in flight at a time (:meth:`generate_variant` runs :meth:`one` on a pool of
    that size; 1: one after the other)."""

    threads: int = 1

    def __init__(self):
        self.instances: dict[str, object] = {}

    # ------------------------------------------------------------------ what a subclass implements
    def load(self, variant: str):
        """The engine instance serving ``variant`` (a server started, a model loaded)."""
        raise NotImplementedError

    def one(self, instance, request) -> dict:
        """One request's record: ``{"completion_ids": [...], "finish_reason": ...}`` plus per-request counters."""
        raise NotImplementedError

    def validate(self, request) -> None:
        """Raise ValueError naming the setting the engine cannot take (its own validation), without generating."""

    def unload(self, instance) -> None:
        """Release one instance (stop its server, free its memory)."""

    # ------------------------------------------------------------------ the plumbing
    def instance(self, variant: str):
        if variant not in self.instances:
            self.instances[variant] = self.load(variant)
        return self.instances[variant]

    def generate(self, requests: Sequence) -> list[dict]:
        out: list = [None] * len(requests)
        for variant in VARIANTS:
            idx = [i for i, r in enumerate(requests) if variant_of(r) == variant]
            if idx:
                records = self.generate_variant(self.instance(variant), variant, [requests[i] for i in idx])
                for i, record in zip(idx, records):
                    out[i] = record
        return out

    def generate_variant(self, instance, variant: str, requests: Sequence) -> list[dict]:
        """The records of requests of one variant, in order (default: :meth:`one` each, ``threads`` at a time)."""
        if self.threads <= 1:
            return [self.one(instance, r) for r in requests]
        with ThreadPoolExecutor(max_workers=self.threads) as pool:
            return list(pool.map(lambda r: self.one(instance, r), requests))

    def counters(self) -> dict | None:
        return None

    def refuses(self, request) -> str | None:
        try:
            self.validate(request)
        except ValueError as exc:
            return str(exc)
        return None

    def close(self) -> None:
        for instance in self.instances.values():
            self.unload(instance)
        self.instances.clear()
