"""A completions file certified at planned looks while it grows (the engine runner's waves).

Invariant: each look runs once, on the lines the file held when it was reached, and the verdict is the one
:func:`conformance.samples.verdict.certify_samples` gives the file at that length with the same looks.
"""
from __future__ import annotations

from .looks import Looks
from .verdict import SamplesVerdict, certify_samples


class GrowingFile:
    """A completions file certified at planned looks while it grows (the engine runner's waves): each
    :meth:`update` runs the looks the lines written since the last one complete, never one twice; the verdict is
    the one :func:`certify_samples` gives the file at that length with the same ``looks``."""

    def __init__(self, path, *, looks: Looks, **settings):
        self.path, self.looks, self.settings = path, looks, settings
        self.verdict: SamplesVerdict | None = None

    @property
    def decided(self) -> bool:
        return self.verdict is not None and self.verdict.sequential.decided

    @property
    def next_n(self) -> int:
        """The lines the next look reads (the first look's before any update)."""
        if self.verdict is None:
            return self.looks.schedule(self.settings["sampling"].greedy)[0].n
        return self.verdict.sequential.next_n

    def update(self) -> SamplesVerdict:
        if self.decided or (self.verdict is not None and _count_lines(self.path) < self.next_n):
            return self.verdict
        resume = None if self.verdict is None else self.verdict.sequential
        self.verdict = certify_samples(self.path, looks=self.looks, resume=resume, **self.settings)
        return self.verdict


def _count_lines(path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())
