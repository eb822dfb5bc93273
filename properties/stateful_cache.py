"""A Hypothesis state machine that checks any KV-cache adapter against fresh prefills.

The machine drives a cache object with the ``specdec_ref.cache.ModelCache`` interface
(``feed(ids[B, n]) -> logits[B, n, V]``, ``trim(n)``, ``commit(n)``, ``reset()``, ``layer_kv()``,
``tentative_length``, ``committed_length``) next to an independent plain-Python model of it: the
list of token ids fed so far and the committed count. After every step it recomputes a *fresh
prefill* of that token list (:func:`specdec_ref.forward.fresh_prefill`: one block forward of the
model with an empty ``DynamicCache``, no ``ModelCache`` code involved) and compares every layer's
K and V; steps that feed tokens also compare the returned logits with the prefill's rows, and
the "read logits" step probes the logits of the next feed (feed one token, compare, trim it back).

Rules: append one token, append a block of 1..8 tokens, trim to a point in ``[0, length]``
(the edges 0, 1, length-1 and length are drawn explicitly and shrunk towards), read logits,
commit to a point in ``[committed, length]``, reset. Invariants: ``tentative_length ==
len(tokens)``, ``committed_length == committed``, and K/V equal the fresh prefill.

Usage (pytest or plain Python)::

    from specdec_properties.stateful_cache import run_cache_machine
    model = tiny_lm("llama")
    run_cache_machine(lambda: ModelCache(model), model)          # raises CacheMismatch on a bug

    TestMyCache = make_cache_machine(lambda: MyCache(model), model).TestCase   # pytest collects it

A failure raises :class:`CacheMismatch` naming the layer, K or V, the first differing position,
the max abs difference and the token / operation history (also recorded with ``note()``).
Tolerances default to ``specdec_ref.cache.ATOL`` / ``RTOL`` (float32, block vs incremental
kernels); pass looser ones for bf16 backends.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from hypothesis import HealthCheck, note
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from specdec_ref.cache import ATOL, RTOL
from specdec_ref.forward import fresh_prefill  # the oracle; re-exported here for the suite's callers
from specdec_ref.models import model_dims

__all__ = [
    "CacheMismatch",
    "fresh_prefill",
    "compare_kv",
    "compare_logits",
    "cut_points",
    "make_cache_machine",
    "run_cache_machine",
    "DEFAULT_SETTINGS",
]

#: Modest defaults: ~25 programs of up to 20 steps, no deadline, no example database on disk.
DEFAULT_SETTINGS = Settings(
    max_examples=25,
    stateful_step_count=20,
    deadline=None,
    database=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class CacheMismatch(AssertionError):
    """The cache under test disagrees with the fresh-prefill oracle (lengths, K/V or logits)."""


def _first_bad(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float, seq_dim: int):
    """(ok, first bad position along seq_dim, max abs diff) in float64."""
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64).expand_as(a)
    diff = (a - e).abs()
    bad = diff > atol + rtol * e.abs()
    if torch.isnan(a).any():
        bad = bad | torch.isnan(a)
    max_diff = float(diff.nan_to_num(float("inf")).max()) if diff.numel() else 0.0
    if not bool(bad.any()):
        return True, None, max_diff
    dims = [d for d in range(bad.dim()) if d != seq_dim]
    per_pos = bad.any(dim=dims[0], keepdim=True) if dims else bad
    for d in dims[1:]:
        per_pos = per_pos.any(dim=d, keepdim=True)
    first = int(per_pos.flatten().nonzero()[0, 0])
    return False, first, max_diff


def compare_kv(actual, expected, *, atol: float = ATOL, rtol: float = RTOL, context: str = "") -> None:
    """Compare per-layer ``(K, V)`` lists; raise :class:`CacheMismatch` naming layer, K/V, position, diff."""
    if len(actual) != len(expected):
        raise CacheMismatch(f"cache has {len(actual)} layers, the model has {len(expected)}{context}")
    for i, ((ak, av), (ek, ev)) in enumerate(zip(actual, expected)):
        for name, a, e in (("K", ak, ek), ("V", av, ev)):
            a_shape, e_shape = tuple(a.shape), tuple(e.shape)
            if a.dim() != 4 or a_shape[1] != e_shape[1] or a_shape[3] != e_shape[3]:
                raise CacheMismatch(f"layer {i} {name}: shape {a_shape}, expected (B,) + {e_shape[1:]}{context}")
            if a_shape[2] != e_shape[2]:
                raise CacheMismatch(
                    f"layer {i} {name}: holds {a_shape[2]} positions, expected {e_shape[2]} "
                    f"(shape {a_shape} vs {e_shape}){context}"
                )
            ok, pos, max_diff = _first_bad(a, e, atol, rtol, seq_dim=2)
            if not ok:
                raise CacheMismatch(
                    f"layer {i} {name}: first differing position {pos}, max abs diff {max_diff:.3g} "
                    f"(atol={atol}, rtol={rtol}){context}"
                )


def compare_logits(actual, expected, *, first_position: int, atol=ATOL, rtol=RTOL, context: str = "") -> None:
    """Compare logits ``[B, n, V]`` with oracle rows ``[1, n, V]``; positions reported absolutely."""
    if actual.dim() != 3 or actual.shape[1:] != expected.shape[1:]:
        raise CacheMismatch(f"logits shape {tuple(actual.shape)}, expected (B,) + {tuple(expected.shape[1:])}{context}")
    ok, row, max_diff = _first_bad(actual, expected, atol, rtol, seq_dim=1)
    if not ok:
        pos = first_position + row
        a = actual[0, row].detach().float().cpu()
        e = expected[0, row].detach().float().cpu()
        raise CacheMismatch(
            f"logits after position {pos} (row {row} of this feed): max abs diff {max_diff:.3g} "
            f"(atol={atol}, rtol={rtol}); argmax {int(a.argmax())} vs oracle {int(e.argmax())}{context}"
        )


def cut_points(low: int, high: int) -> st.SearchStrategy[int]:
    """Integers in ``[low, high]`` that favour (and shrink towards) the edges low, low+1, high-1, high."""
    edges = sorted({low, min(low + 1, high), max(high - 1, low), high})
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def make_cache_machine(
    make_cache: Callable[[], Any],
    model,
    *,
    vocab_size: int | None = None,
    batch_size: int = 1,
    max_length: int = 40,
    max_block: int = 8,
    atol: float = ATOL,
    rtol: float = RTOL,
    with_commit: bool = True,
    with_reset: bool = True,
) -> type[RuleBasedStateMachine]:
    """A ``RuleBasedStateMachine`` class checking caches made by ``make_cache()`` against ``model``.

    ``make_cache`` must return a fresh, empty cache for ``model`` (batch ``batch_size``; the machine
    feeds the same tokens to every row). ``max_length`` bounds the token list (keep it below the
    model's max positions); ``with_commit`` / ``with_reset`` drop those rules for caches without them.
    """
    if vocab_size is None:
        vocab_size = model_dims(model)["vocab_size"]
    token = st.integers(0, vocab_size - 1)

    class CacheMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.cache = make_cache()
            self.tokens: list[int] = []
            self.committed = 0
            self.ops: list[str] = []
            self._oracle_key: tuple[int, ...] | None = None
            self._oracle_val = None

        # -------------------------------------------------------------- helpers
        def _context(self) -> str:
            return f"\n  tokens ({len(self.tokens)}): {self.tokens}\n  ops: {'; '.join(self.ops)}"

        def _oracle(self, tokens: list[int]):
            key = tuple(tokens)
            if key != self._oracle_key:
                self._oracle_val = fresh_prefill(model, list(tokens))
                self._oracle_key = key
            return self._oracle_val

        def _ids(self, block: list[int]) -> torch.Tensor:
            return torch.tensor([block], dtype=torch.long).expand(batch_size, len(block))

        def _feed(self, block: list[int]) -> None:
            start = len(self.tokens)
            self.ops.append(f"feed{block}")
            note(f"step: feed {block} at positions {start}..{start + len(block) - 1}")
            logits = self.cache.feed(self._ids(block))
            self.tokens.extend(block)
            oracle_logits, _ = self._oracle(self.tokens)
            compare_logits(
                logits, oracle_logits[:, start:], first_position=start, atol=atol, rtol=rtol, context=self._context()
            )

        # -------------------------------------------------------------- rules
        @precondition(lambda self: len(self.tokens) < max_length)
        @rule(tok=token)
        def append_one(self, tok):
            self._feed([tok])

        @precondition(lambda self: len(self.tokens) < max_length)
        @rule(block=st.lists(token, min_size=1, max_size=max_block))
        def append_block(self, block):
            self._feed(block[: max_length - len(self.tokens)])

        @rule(data=st.data())
        def trim(self, data):
            n = data.draw(cut_points(0, len(self.tokens)), label="trim to")
            self.ops.append(f"trim({n})")
            note(f"step: trim({n}) from length {len(self.tokens)}")
            self.cache.trim(n)
            del self.tokens[n:]
            self.committed = min(self.committed, n)

        @precondition(lambda self: len(self.tokens) < max_length)
        @rule(tok=token)
        def read_logits(self, tok):
            """Probe the logits of the next feed, then roll the probe back."""
            start = len(self.tokens)
            self.ops.append(f"probe[{tok}]")
            note(f"step: read logits (feed {tok} at position {start}, then trim({start}))")
            logits = self.cache.feed(self._ids([tok]))
            oracle_logits, _ = self._oracle(self.tokens + [tok])
            compare_logits(
                logits, oracle_logits[:, start:], first_position=start, atol=atol, rtol=rtol, context=self._context()
            )
            self.cache.trim(start)

        @precondition(lambda self: with_commit)
        @rule(data=st.data())
        def commit(self, data):
            n = data.draw(cut_points(self.committed, len(self.tokens)), label="commit to")
            self.ops.append(f"commit({n})")
            note(f"step: commit({n}) from length {len(self.tokens)}, committed {self.committed}")
            self.cache.commit(n)
            del self.tokens[n:]
            self.committed = n

        @precondition(lambda self: with_reset)
        @rule()
        def reset(self):
            self.ops.append("reset")
            note("step: reset")
            self.cache.reset()
            self.tokens.clear()
            self.committed = 0

        # -------------------------------------------------------------- invariants
        @invariant()
        def lengths_match(self):
            t, c = self.cache.tentative_length, self.cache.committed_length
            if t != len(self.tokens):
                raise CacheMismatch(f"tentative_length {t} != {len(self.tokens)} tokens fed{self._context()}")
            if with_commit and c != self.committed:
                raise CacheMismatch(f"committed_length {c} != expected {self.committed}{self._context()}")

        @invariant()
        def kv_matches_fresh_prefill(self):
            _, expected = self._oracle(self.tokens)
            compare_kv(self.cache.layer_kv(), expected, atol=atol, rtol=rtol, context=self._context())

    CacheMachine.__name__ = CacheMachine.__qualname__ = f"CacheMachine_{getattr(make_cache, '__name__', 'cache')}"
    return CacheMachine


def run_cache_machine(
    make_cache: Callable[[], Any],
    model,
    settings: Settings | None = None,
    **machine_kwargs: Any,
) -> None:
    """Run the machine outside pytest (``run_state_machine_as_test``); raises on the first (shrunk) failure.

    ``settings`` default to :data:`DEFAULT_SETTINGS`; ``machine_kwargs`` go to :func:`make_cache_machine`.
    """
    machine = make_cache_machine(make_cache, model, **machine_kwargs)
    run_state_machine_as_test(machine, settings=settings or DEFAULT_SETTINGS)


def fresh_head_kv(spec, target, text, length: int) -> list:
    """The head-cache oracle: the K/V a proposer head's decoder layers (``spec.layers``) hold after reading the pairs
    ``(c_p+1, f_p)``, ``p < length``, of ``text`` (host ids), computed afresh from the spec's weights: the target's
    features ``f`` from one forward over ``text`` (``FINAL``: its last hidden state after the final norm; layer ``l``:
    the stream entering layer ``l``), the head's input at position ``p`` (EAGLE ``fc([E c, f])``; EAGLE-3 with
    ``fuse`` over its aux layers first; MTP with its RMS norms and the token zeroed at position 0), then one block
    forward of the layers on an empty cache. ``[(K, V) per layer]``, ``(1, kv_heads, length, head_dim)``."""
    import torch.nn.functional as F
    from transformers import DynamicCache

    from specdec_ref.forward import cache_arg

    kind = spec.proposer_kind
    if length == 0:  # nothing read yet (a one-token prompt's first round)
        from specdec_ref.dims import model_dims

        dims, param = model_dims(spec.layers), next(spec.layers.parameters())
        empty = torch.empty((1, dims["num_kv_heads"], 0, dims["head_dim"]), dtype=param.dtype, device=param.device)
        return [(empty, empty)] * dims["num_layers"]
    ids = torch.tensor([list(text)[: length + 1]], device=next(target.parameters()).device)
    with torch.no_grad():
        hidden = target.model(input_ids=ids, output_hidden_states=True).hidden_states
        embed = (spec.embed if getattr(spec, "embed", None) is not None else target.get_input_embeddings().weight)
        tokens = F.embedding(ids[:, 1:], embed)  # c_1 .. c_length
        if kind == "eagle3":
            layers = sorted(set(spec.aux_layers))
            feature = F.linear(torch.cat([hidden[layer] for layer in layers], -1), spec.fuse)
        else:
            feature = hidden[-1]  # after the final norm
        feature = feature[:, :length].to(tokens.dtype)
        if kind == "mtp":
            def rms(x, w):
                y = x.float()
                ms = y.pow(2).mean(-1, keepdim=True) + spec.eps
                y = (y * torch.where(ms > 0, torch.rsqrt(ms), torch.zeros_like(ms))).to(x.dtype)
                return y if w is None else w * y

            tokens = rms(tokens, spec.enorm)
            if spec.mask_position0:
                tokens[:, 0] = 0
            feature = rms(feature, spec.hnorm)
        x = F.linear(torch.cat([tokens, feature], -1), spec.fc, getattr(spec, "fc_bias", None))
        cache = DynamicCache(config=spec.layers.config)
        positions = torch.arange(length, device=ids.device)[None]
        spec.layers(inputs_embeds=x, position_ids=positions, use_cache=True, **cache_arg(spec.layers, cache))
    return [(layer.keys, layer.values) for layer in cache.layers]
