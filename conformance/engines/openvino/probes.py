"""A serving condition's evidence read off OpenVINO GenAI's own block accounting.

The engine counts no prefix-cache hits and no prefill chunks, and does not report its KV block size; its pipeline
reports the share of its KV pool in use (``PipelineMetrics.cache_usage``, the last step's) and lets a caller submit
requests and run steps one at a time (``add_request``, ``step``). A condition's session therefore runs a few probe
requests in the same pipeline, with the condition's settings, and reads:

* **the KV block size**: probe prompts of 2, 3, ... tokens, each alone and generating one token, before any other
  request; the first that held two blocks of the pool (its most in use so far) is one token longer than a block (a
  prompt of B tokens fills one block of B slots);
* **the token budget**: the steps a probe of the condition's longest prompt takes to its first token, one per prefill
  chunk. The configured budget is stated when the prompt took ``ceil(L / budget)`` steps; otherwise the prompt's own
  length (the engine did not chunk it as configured, and the evidence ``token_budget < longest prompt`` fails);
* **prefix-cache hits**: a probe of three blocks and one token starts and keeps generating; a second probe sharing
  its three blocks joins. The blocks the pool gave the second, against the blocks its prompt fills, are the blocks
  the prefix cache served it (a request's blocks are shared with another only through the prefix cache).

The probes' prompts are made of one repeated token after ``<bos>`` (no case prompt shares a block with them) and
every probe finishes before the condition's first batch. Pure: the pipeline and its configs come from the caller.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["PROBE_IDS", "BlockProbe", "stated_budget"]

#: Request ids of the probes (far from the ids ``generate`` gives its requests: 0, 1, ...).
PROBE_IDS = 1_000_000_000


@dataclass
class BlockProbe:
    """Probe requests in ``pipe`` (``add_request(id, input, config)``, ``step()``, ``has_non_finished_requests()``,
    ``get_metrics().cache_usage`` in percent of ``pool_blocks``); ``request(prompt, max_new_tokens)`` builds the
    ``(input, config)`` pair of one greedy request of this pipeline's configuration."""

    pipe: Any
    pool_blocks: int
    request: Callable[[list[int], int], tuple[Any, Any]]
    bos: int
    filler: tuple[int, int, int] = (5, 4, 3)
    submitted: int = 0
    handles: list = field(default_factory=list)

    def held(self, *, most: bool = False) -> int:
        """Blocks of the pool in use at the last step (``most``: the most in use at any step so far)."""
        m = self.pipe.get_metrics()
        return round((m.max_cache_usage if most else m.cache_usage) * self.pool_blocks / 100)

    def _add(self, prompt: list[int], max_new_tokens: int) -> None:
        """Submit a probe; its handle is kept until :meth:`_drain` (the engine drops a request whose handle is gone)."""
        inp, cfg = self.request(prompt, max_new_tokens)
        self.submitted += 1
        self.handles.append(self.pipe.add_request(PROBE_IDS + self.submitted, inp, cfg))

    def _drain(self) -> int:
        """Steps until every probe has finished (their count); raises if one did not finish."""
        steps = 0
        while self.pipe.has_non_finished_requests():
            self.pipe.step()
            steps += 1
        unfinished = [h.get_status() for h in self.handles if "FINISHED" not in str(h.get_status())]
        self.handles.clear()
        if unfinished:
            raise RuntimeError(f"a probe request ended {unfinished[0]}, not finished: the evidence cannot be read")
        return steps

    def _prompt(self, length: int, which: int = 0) -> list[int]:
        return [self.bos] + [self.filler[which]] * (length - 1)

    def block_size(self, longest: int = 256) -> int | None:
        """The pool's block size in tokens: one less than the shortest probe prompt that holds two blocks (None: no
        prompt up to ``longest`` tokens did, or the first already held more than one)."""
        for length in range(2, longest + 1):  # the pool's most so far: a one-token request frees its blocks in its step
            self._add(self._prompt(length), 1)
            self._drain()
            blocks = self.held(most=True)
            if blocks >= 2:
                return length - 1 if blocks == 2 and length > 2 else None
        return None

    def prefill_steps(self, length: int) -> int:
        """Steps a probe prompt of ``length`` tokens takes to its first (only) token: its prefill chunks."""
        self._add(self._prompt(length, 1), 1)
        return self._drain()

    def prefix_served(self, block: int) -> int:
        """Tokens the prefix cache served a probe sharing three full blocks with a running one (0: none)."""
        first = self._prompt(3 * block + 1, 2)
        self._add(first, 4)
        self.pipe.step()  # the first probe's prompt computed: its three full blocks are in the cache
        before = self.held()
        self._add(first[:3 * block] + [self.filler[0], self.filler[1]], 2)
        self.pipe.step()  # the second probe's prefill, the first's next token (inside its fourth block)
        allocated = self.held() - before
        self._drain()
        needed = math.ceil((3 * block + 2) / block)
        return max(0, needed - allocated) * block


def stated_budget(budget: int, length: int, steps: int) -> int:
    """The token budget the evidence states: ``budget`` when a ``length``-token prompt took ``ceil(length / budget)``
    prefill steps, else ``length`` (not chunked as configured)."""
    return budget if steps == math.ceil(length / budget) and steps > 1 else length
