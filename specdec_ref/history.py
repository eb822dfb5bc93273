"""History-dependent sampling: penalties, logit bias, ``min_new_tokens`` and token constraints.

A request's next-token distribution may depend on the tokens before it. At a position whose history
is the prompt ``P`` and the generated tokens ``G`` (committed tokens, then, inside a speculative block,
the drafts before that position), the raw logits ``z`` go through, in this order:

1. ``logit_bias``: ``z[v] += bias[v]``;
2. ``repetition_penalty r`` (transformers / vLLM): for every ``v`` in ``P`` or ``G``,
   ``z[v] = z[v] / r`` if ``z[v] > 0`` else ``z[v] * r``;
3. ``presence_penalty a`` and ``frequency_penalty f`` (OpenAI / vLLM, generated tokens only):
   ``z[v] -= a * [count_G(v) > 0] + f * count_G(v)``;
4. ``min_new_tokens n``: while ``len(G) < n`` every EOS id of the request gets ``-inf``;
5. ``constraint`` (a :class:`TokenAutomaton`, the stand-in for a grammar) and ``bad_words``: tokens the automaton
   forbids in the state reached by reading ``G`` get ``-inf`` (bad words are an automaton too, run as the product
   with the constraint: :func:`specdec_ref.automaton.automaton_of`);

then greedy takes the first-index argmax, and sampling applies :func:`specdec_ref.warp.warp_logits`
(temperature, top-k, top-p, min-p) and the softmax.

The invariant speculative decoding must keep: **target rows and draft proposals are processed
identically, each on its own hypothetical history**. Row ``i`` of a verify block (it judges ``d_{i+1}``)
sees ``G + d_1 .. d_i``; the draft's ``i``-th proposal sees the same. Nothing is stored for drafts:
:class:`SamplingState` holds the committed history only and advances by the tokens a round commits,
so a rejection rolls the counts back by construction.

Everything here runs on the logits' device with tensor ops (no host synchronisation); rows with
different settings are processed group by group.
"""
from __future__ import annotations

import functools
from typing import Sequence

import torch
import torch.nn.functional as F

from .automaton import TokenAutomaton, automaton_of
from .warp import SamplingConfig, warp_logits

__all__ = ["TokenAutomaton", "SamplingState", "process_logits", "warp_rows"]


@functools.lru_cache(maxsize=1024)
def constant(values: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A read-only device tensor of ``values``, made once per (values, dtype, device): the per-position steps of a
    round reuse it instead of copying host lists to the device at every call (a blocking copy on an accelerator)."""
    return torch.tensor(values, dtype=dtype, device=device)


@functools.lru_cache(maxsize=256)
def _eos_mask(eos_ids: tuple[tuple[int, ...], ...], vocab: int, device: torch.device) -> torch.Tensor:
    """``[rows, V]`` bool: True at each row's EOS ids (read-only, cached like :func:`constant`)."""
    mask = torch.zeros(len(eos_ids), vocab, dtype=torch.bool)
    for row, eos in enumerate(eos_ids):
        mask[row, list(eos)] = True
    return mask.to(device)


def _eos_tuple(eos) -> tuple[int, ...]:
    if type(eos) is tuple:  # the decoders' validated ids (tuples of ints)
        return eos
    if eos is None:
        return ()
    if isinstance(eos, int) and not isinstance(eos, bool):
        return (eos,)
    return tuple(int(e) for e in eos)


class SamplingState:
    """Per-row committed history that history-dependent settings read (rows = requests; device tensors).

    ``seen[b, v]``: ``v`` occurs in row ``b``'s prompt or generated tokens; ``counts[b, v]``: occurrences of
    ``v`` among the generated tokens; ``generated[b]``: how many were generated; ``state[b]``: the
    constraint's automaton state (0 for rows without one). Only :meth:`commit` changes them, with the
    tokens a round commits, so drafts never leak into the history.
    """

    def __init__(self, prompts: Sequence[Sequence[int]], configs: Sequence[SamplingConfig], eos_ids, vocab: int, device):
        self.configs = list(configs)
        self.eos_ids = [_eos_tuple(e) for e in eos_ids]
        self.vocab = vocab
        self.device = torch.device(device)
        b = len(self.configs)
        if not (len(prompts) == len(self.eos_ids) == b):
            raise ValueError(f"SamplingState: {len(prompts)} prompts, {len(self.configs)} configs, {len(self.eos_ids)} EOS lists")
        self.active = any(c.history_dependent for c in self.configs)
        for c in self.configs:
            bad = [t for t, _ in c.logit_bias if t >= vocab]
            if bad:
                raise ValueError(f"logit_bias names token {bad[0]}, outside the vocabulary [0, {vocab})")
            if c.constraint is not None and c.constraint.vocab != vocab:
                raise ValueError(f"constraint automaton has {c.constraint.vocab} tokens per state, the vocabulary has V={vocab}")
        self.automata = [automaton_of(c.constraint, c.bad_words, vocab) for c in self.configs]
        if not self.active:
            return
        rows = [i for i, p in enumerate(prompts) for _ in p]
        ids = [int(t) for p in prompts for t in p]
        self.seen = torch.zeros(b, vocab, dtype=torch.bool, device=self.device)
        index = torch.tensor([rows, ids], dtype=torch.long, device=self.device)
        self.seen[index[0], index[1]] = True  # one scatter for every prompt
        self.counts = torch.zeros(b, vocab, dtype=torch.float32, device=self.device)
        self.generated = torch.zeros(b, dtype=torch.long, device=self.device)
        self.state = torch.tensor([a.start if a else 0 for a in self.automata], dtype=torch.long, device=self.device)

    def __len__(self) -> int:
        return len(self.configs)

    # ------------------------------------------------------------------ block views
    def positions(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """The history at positions ``0 .. n`` of a block whose tokens are ``tokens[B, n]``: position ``i`` has
        read the committed history plus ``tokens[:, :i]``. Returns ``seen [B, n+1, V]``, ``counts [B, n+1, V]``,
        ``generated [B, n+1]`` and ``state [B, n+1]`` (automaton states; a forbidden token leads to state 0,
        only reachable by tokens the verifier will reject)."""
        b, n = tokens.shape
        onehot = F.one_hot(tokens.clamp_min(0), self.vocab).to(torch.float32) * (tokens >= 0).unsqueeze(-1)
        cum = torch.cat([torch.zeros(b, 1, self.vocab, device=self.device), onehot.cumsum(1)], 1)
        states = [self.state]
        for c_index in range(n):
            states.append(self._step_states(states[-1], tokens[:, c_index]))
        return {
            "seen": self.seen.unsqueeze(1) | (cum > 0),
            "counts": self.counts.unsqueeze(1) + cum,
            "generated": self.generated.unsqueeze(1) + torch.arange(n + 1, device=self.device),
            "state": torch.stack(states, 1),
        }

    def _step_states(self, state: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        out = state
        for _, rows, c in _groups(self.automata, self.device):
            if c is None:
                continue
            nxt = c.table(self.device)[state[rows], token[rows].clamp_min(0)].clamp_min(0)
            out = out.index_copy(0, rows, nxt)
        return out

    # ------------------------------------------------------------------ updates
    def commit(self, tokens: torch.Tensor, keep: torch.Tensor) -> None:
        """The first ``keep[b]`` tokens of ``tokens[b]`` join row ``b``'s history (``keep``: Long[B] on the device)."""
        if not self.active:
            return
        n = tokens.shape[1]
        mask = torch.arange(n, device=self.device) < keep.unsqueeze(1)
        t = tokens.clamp_min(0)
        self.counts.scatter_add_(1, t, mask.to(torch.float32))
        self.seen |= self.counts > 0
        for i in range(n):
            stepped = self._step_states(self.state, t[:, i])
            self.state = torch.where(mask[:, i], stepped, self.state)
        self.generated += keep

    def select(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (finished requests leave the batch), in that order."""
        self.configs = [self.configs[i] for i in rows]
        self.automata = [self.automata[i] for i in rows]
        self.eos_ids = [self.eos_ids[i] for i in rows]
        if not self.active:
            return
        index = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        for name in ("seen", "counts", "generated", "state"):
            setattr(self, name, getattr(self, name).index_select(0, index))


def _apply_one(x: torch.Tensor, config: SamplingConfig, eos_ids: Sequence[tuple[int, ...]], hist: dict | None) -> torch.Tensor:
    """Steps 1-5 of the module docstring for rows sharing ``config``: ``x [b, m, V]`` float32, ``hist`` their views."""
    if not config.history_dependent:
        return x
    if config.logit_bias:
        ids = constant(tuple(t for t, _ in config.logit_bias), torch.long, x.device)
        bias = constant(tuple(b for _, b in config.logit_bias), x.dtype, x.device)
        x = x.index_add(-1, ids, bias.expand(*x.shape[:-1], -1))
    if config.repetition_penalty != 1.0:
        r = config.repetition_penalty
        x = torch.where(hist["seen"], torch.where(x > 0, x / r, x * r), x)
    if config.presence_penalty or config.frequency_penalty:
        counts = hist["counts"]
        x = x - (config.presence_penalty * (counts > 0).to(x.dtype) + config.frequency_penalty * counts)
    if config.min_new_tokens and any(eos_ids):
        is_eos = _eos_mask(tuple(eos_ids), x.shape[-1], x.device)
        early = hist["generated"] < config.min_new_tokens  # [b, m]
        x = x.masked_fill(early.unsqueeze(-1) & is_eos.unsqueeze(1), float("-inf"))
    automaton = automaton_of(config.constraint, config.bad_words, x.shape[-1])
    if automaton is not None:
        allowed = automaton.table(x.device)[hist["state"]] >= 0  # [b, m, V]
        x = x.masked_fill(~allowed, float("-inf"))
    return x


def process_logits(logits: torch.Tensor, configs: Sequence[SamplingConfig], state: SamplingState | None = None,
                   tokens: torch.Tensor | None = None) -> torch.Tensor:
    """The logits of every row after its own settings, history-dependent steps included, before the softmax.

    ``logits [B, m, V]`` are aligned to the *end* of ``tokens [B, j]`` (``m <= j + 1``): position ``r`` has
    the committed history plus ``tokens[:, : j - m + 1 + r]``. A verify block passes the drafts (``m = j + 1``);
    the draft's ``i``-th proposal passes ``drafts[:, :i]`` with ``m = 1``. Greedy rows come back with the
    history-dependent steps only (their argmax is the choice); sampling rows are also warped
    (temperature, top-k, top-p, min-p). float32 on the logits' device.
    """
    if logits.dim() != 3 or logits.shape[0] != len(configs):
        raise ValueError(f"logits must be [B={len(configs)}, m, V], got {tuple(logits.shape)}")
    b, m, _ = logits.shape
    if (state is None or not state.active) and any(c.history_dependent for c in configs):
        raise ValueError("history-dependent settings need the rows' SamplingState (state=None or built for other settings)")
    x = logits.to(torch.float32)
    hist = None
    if state is not None and state.active:
        if tokens is None:
            tokens = torch.zeros(b, 0, dtype=torch.long, device=logits.device)
        views = state.positions(tokens)
        hist = {name: v[:, v.shape[1] - m :] for name, v in views.items()}
    groups = list(_groups(configs, x.device))
    out = None if len(groups) == 1 else torch.empty_like(x)
    for row_list, rows, config in groups:
        whole = out is None
        part = x if whole else x.index_select(0, rows)
        part_hist = None
        if hist is not None:
            part_hist = hist if whole else {name: v.index_select(0, rows) for name, v in hist.items()}
        eos = [state.eos_ids[i] for i in row_list] if state is not None else [()] * len(row_list)
        part = warp_logits(_apply_one(part, config, eos, part_hist), config)
        if whole:
            return part
        out.index_copy_(0, rows, part)
    return out


@functools.lru_cache(maxsize=64)
def _all_rows(n: int, device: torch.device) -> tuple[list[int], torch.Tensor]:
    """``(list(range(n)), arange(n) on device)``, made once per size (read-only, like :func:`constant`)."""
    return list(range(n)), torch.arange(n, device=device)


def _groups(values: Sequence, device):
    """``(rows as a list, rows as a Long tensor on device, value)`` for each distinct value, in first-seen order."""
    n = len(values)
    if n and isinstance(values, (list, tuple)) and values.count(values[0]) == n:  # one value for every row (the usual
        rows, index = _all_rows(n, torch.device(device))  # batch): no per-row grouping (count compares by identity first)
        yield rows, index, values[0]
        return
    groups: dict = {}
    for i, v in enumerate(values):
        groups.setdefault(v, []).append(i)
    for value, rows in groups.items():
        yield rows, constant(tuple(rows), torch.long, torch.device(device)), value


def warp_rows(logits: torch.Tensor, configs: Sequence[SamplingConfig], state: SamplingState | None = None,
              tokens: torch.Tensor | None = None) -> torch.Tensor:
    """Probabilities ``[B, m, V]``: the softmax of :func:`process_logits` (greedy rows: of their processed logits)."""
    return torch.softmax(process_logits(logits, configs, state, tokens), dim=-1)
