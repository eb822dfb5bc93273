"""Samples that grow across a case's looks instead of being redrawn at each one.

``conformance.registry.run_case`` looks at a statistical case up to three times (the interim look at 5% of its
sample, the early-pass look at half, the full look at ``reserve_scale()``). A check draws its sample through
:func:`draws` (a list of draws) or :func:`chunks` (per-chunk results, e.g. counts, summed by the caller); every look
of the case then takes a prefix of the same stream, and a look draws only what the looks before it did not.

The stream is canonical, so a look's sample never depends on which looks came before it: it is cut into chunks of a
fixed size, each drawn whole and in order from state (generators) that only the check's seed fixes. A look of n draws
gets the first n draws (:func:`draws`) or the first ``ceil(n / chunk)`` whole chunks (:func:`chunks`, which states the
count it covers). Reusing draws across looks is valid for the procedure's stated error rates: the interim look's
alpha and the final look's alpha add up (union bound) and the early-pass look's beta is subtracted from the final
look's power (union bound) whatever the dependence between the looks' samples.

Streams live on the case's :class:`CheckContext` (``ctx.streams``, fresh for every ``run_case``), or in a memo the
caller owns for a sample that cases share (the verifier's scenario groups). A chunk that raises is not kept and the
stream is dropped, so a later look redraws it from the seed rather than continue from a half-advanced state.
"""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["Stream", "draws", "chunks", "memo"]


class Stream:
    """Chunks drawn in order by ``draw(state, index, size)`` from ``state = start()``; ``size`` is always ``chunk``."""

    def __init__(self, start: Callable[[], Any], draw: Callable[[Any, int, int], Any], chunk: int):
        if chunk < 1:
            raise ValueError(f"a stream's chunk must be >= 1, got {chunk}")
        self.start, self.draw, self.chunk = start, draw, chunk
        self.state: Any = None
        self.results: list = []

    def extend_to(self, count: int) -> list:
        """The results of the first ``count`` chunks, drawing those not drawn yet."""
        if self.state is None and not self.results:
            self.state = self.start()
        while len(self.results) < count:
            self.results.append(self.draw(self.state, len(self.results), self.chunk))
        return self.results[:count]


def _stream(memo: dict, key, start, draw, chunk: int) -> Stream:
    stream = memo.get(key)
    if stream is None:
        stream = memo[key] = Stream(start, draw, chunk)
    return stream


def _extend(memo: dict, key, stream: Stream, count: int) -> list:
    try:
        return stream.extend_to(count)
    except BaseException:
        memo.pop(key, None)  # never continue from a state that a raising chunk left half-advanced
        raise


def draws(memo: dict, key, n: int, *, start: Callable[[], Any], draw: Callable[[Any, int, int], list],
          chunk: int = 1) -> list:
    """The first ``n`` draws of stream ``key``: ``draw(state, index, chunk)`` returns the ``chunk`` draws of chunk
    ``index``. The stream keeps the ``start`` and ``draw`` of the look that created it, so they must depend only on the
    seed and the check's settings (which ``key`` names), never on the look: no look-sized tensor in their closure."""
    stream = _stream(memo, key, start, draw, chunk)
    out = [d for part in _extend(memo, key, stream, -(-n // chunk)) for d in part]
    return out[:n]


def chunks(memo: dict, key, n: int, *, start: Callable[[], Any], draw: Callable[[Any, int, int], Any],
           chunk: int) -> tuple[list, int]:
    """``(results, covered)``: the results of the whole chunks of stream ``key`` that cover ``n`` draws, and the
    number of draws they cover (``n`` rounded up to whole chunks)."""
    stream = _stream(memo, key, start, draw, chunk)
    count = -(-n // chunk)
    return _extend(memo, key, stream, count), count * chunk


def memo(streams: dict, key) -> dict:
    """A dict kept with the case's streams for results that depend only on the draws (e.g. exact laws per drawn
    state), so that a later look computes only those of its new draws."""
    return streams.setdefault(("memo", key), {})
