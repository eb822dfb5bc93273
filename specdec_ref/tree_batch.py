"""Batched tree speculative decoding: many requests per call, each row its own tree, lengths and generator.

:func:`decode_tree_batch` runs the rounds of :class:`~specdec_ref.tree_decode.TreeSpeculativeDecoder` for every
request at once: one draft call per level and one target call per round for the whole batch, each row's nodes
written at its own slots with its own tree mask and depth positions (:meth:`RowCaches.feed_tree`), the tree verifier
on all rows, one host sync, then each row's path compacted in place (:meth:`RowCaches.compact`). Rows whose round has
another shape (near the position limit) or another sampling setting run as their own group that round.

Invariant (the contract's batch invariance): a seeded request gives bit for bit what ``decode_tree`` gives it alone.
Its draws come from its own generator in the same order: each level's children, then the verifier's final-sample
exponentials, then its coins (``decode_tree`` verifies with the one-row list ``[generator]``, the per-row order).
Draft models only (EAGLE / Medusa heads: ``decode_tree``), no history-dependent settings (as ``decode_tree``).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .contract import DecodeResult, NotSupportedError, Request, RoundHook
from .decode import _Batch, _open_row_caches, _truncate, end_round, validate_requests
from .draft_tree import fed_parents, same_path_rows, tree_nodes
from .models import model_dims
from .proposers import is_model
from .row_cache import RowCaches

__all__ = ["decode_tree_batch"]

_FIELDS = ("prompts", "configs", "eos", "max_new", "generators")


def decode_tree_batch(decoder, target, draft, requests: Sequence[Request], *, depth: int, width: int,
                      on_round: RoundHook | None = None) -> list[DecodeResult]:
    """Tree speculative decoding of every request (module docstring); one :class:`DecodeResult` per request, in order.
    ``on_round(record, target_cache, draft_cache)`` runs after every round for every row still in the batch."""
    for name, value in (("depth", depth), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not is_model(draft):
        raise NotSupportedError("decode_tree_batch drafts trees with a draft model; heads decode one request at a time "
                                "(decode_tree)")
    batch = validate_requests(target, draft, requests, depth)
    for i, config in enumerate(batch.configs):
        if config.history_dependent:
            raise NotSupportedError(f"request {i}: the tree decoder does not apply history-dependent settings "
                                    f"({config.label()})")
    vocab = model_dims(target)["vocab_size"]
    if width > vocab:
        raise ValueError(f"width must be at most the vocabulary size {vocab} (distinct siblings), got {width}")
    results = [DecodeResult(tokens=[], prompt_len=p.shape[1], finished_by="max_new_tokens") for p in batch.prompts]
    live = [i for i in range(len(batch)) if batch.max_new[i] > 0]
    if not live:
        return results
    sub = _Batch(*[[getattr(batch, f)[i] for i in live] for f in _FIELDS])
    tokens = [p[0].tolist() for p in sub.prompts]
    extra = tree_nodes(depth, width)
    target_cache, fed = _open_row_caches(decoder.make_cache, target, sub, extra, tokens)
    draft_cache, _ = _open_row_caches(decoder.make_draft_cache, draft, sub, extra, tokens)
    limit = min(c.cache.max_positions or 1 << 30 for c in (target_cache, draft_cache))
    calls = {"target": int(fed), "draft": int(fed)}
    committed = [p.shape[1] for p in sub.prompts]
    pending = torch.cat([p[:, -1:] for p in sub.prompts])
    while live:
        starts = [c - 1 for c in committed]  # each row's pending-token slot
        shapes = [decoder.shape(depth, width, sub.max_new[j] - len(results[i].tokens), limit - starts[j])
                  for j, i in enumerate(live)]
        groups: dict = {}
        for j in range(len(live)):
            groups.setdefault((shapes[j], sub.configs[j]), []).append(j)
        outcome: list = [None] * len(live)
        whole = len(groups) == 1
        for ((levels, kids), config), rows in groups.items():
            t_rows = target_cache if whole else target_cache.take(rows)
            d_rows = draft_cache if whole else draft_cache.take(rows)
            part = _Round(decoder, t_rows, d_rows, pending if whole else pending[rows], [starts[j] for j in rows],
                          levels, kids, config, [sub.generators[j] for j in rows])
            flat = part.run()  # the one host sync of the group's round
            for r, j in enumerate(rows):
                outcome[j] = (part, r, flat[r])
            if not whole:
                target_cache.put(rows, t_rows)
                draft_cache.put(rows, d_rows)
        calls["target"] += len(groups)
        calls["draft"] += sum(part.draft_calls for part in {id(o[0]): o[0] for o in outcome}.values())
        # every row's tokens, then each group's repair (compaction and the draft's catch-up), as decode_tree does
        done, new_pending, emitted_of, finals = [], [], [], []
        repairs: dict = {}
        for j, i in enumerate(live):
            part, r, (accepted, path, row, slots) = outcome[j]
            res = results[i]
            untruncated = [x for x in row if x >= 0][: sub.max_new[j] - len(res.tokens)]
            emitted, hit_eos = _truncate(untruncated, sub.eos[j])
            kept = decoder.kept_in_cache(emitted, untruncated)
            repairs.setdefault(id(part), (part, []))[1].append((r, kept, path[: kept - 1], slots))
            res.tokens.extend(emitted)
            res.host_syncs += 1
            committed[j] += len(emitted)
            new_pending.append(part.path_token(r, len(emitted) - 1))
            emitted_of.append(emitted)
            finals.append((part, r, accepted, hit_eos))
            done.append(hit_eos or len(res.tokens) >= sub.max_new[j])
        for part, row_repairs in repairs.values():
            rows = [j for j in range(len(live)) if outcome[j][0] is part]
            t_rows = target_cache if whole else target_cache.take(rows)
            d_rows = draft_cache if whole else draft_cache.take(rows)
            calls["draft"] += part.repair(t_rows, d_rows, row_repairs)
            if not whole:
                target_cache.put(rows, t_rows)
                draft_cache.put(rows, d_rows)
        pending = torch.stack(new_pending)[:, None]
        for j, i in enumerate(live):
            part, r, accepted, hit_eos = finals[j]
            res = results[i]
            res.target_calls, res.draft_calls = calls["target"], calls["draft"]
            end_round(res, on_round, target_cache.row(j), draft_cache.row(j), start=starts[j] + 1,
                      proposed=part.size, accepted=accepted, emitted=len(emitted_of[j]), committed=committed[j],
                      hit_eos=hit_eos, row=i)
        stay = [j for j, d in enumerate(done) if not d]
        if len(stay) < len(live):
            live = [live[j] for j in stay]
            for f in _FIELDS:
                setattr(sub, f, [getattr(sub, f)[j] for j in stay])
            committed = [committed[j] for j in stay]
            target_cache.select(stay)
            draft_cache.select(stay)
            pending = pending[stay] if stay else pending[:0]
    return results


class _Round:
    """One round of a group of rows that share the tree's shape and the sampling setting (module docstring)."""

    def __init__(self, decoder, target_cache: RowCaches, draft_cache: RowCaches, pending: torch.Tensor,
                 starts: list[int], levels: int, width: int, config, generators: list):
        self.decoder, self.target_cache, self.draft_cache = decoder, target_cache, draft_cache
        self.pending, self.starts, self.levels, self.width = pending, starts, levels, width
        self.config, self.generators = config, generators
        self.size, self.draft_calls = 0, 0

    def run(self) -> list:
        """``(accepted, path, row tokens, path nodes' draft slots)`` per row (host lists, one read)."""
        if self.levels == 0:  # no room for a tree: a plain target step (the draft follows the pending token)
            self.draft_cache.feed(self.pending)
            logits = self.target_cache.feed(self.pending)
            rows = self.decoder.target_rows(logits, self.config)[:, -1]
            final = self._choose(rows)
            self.path_tokens = final[:, None]
            self.draft_calls = 0  # counted by the repair (the plain step's draft call)
            return [(0, [], [x], []) for x in final.tolist()]
        tokens, parents, qs, draft_slots = self.grow()
        self.size = tokens.shape[1]
        m, path, out = self.verify(tokens, parents, qs)
        levels = self.levels
        on_path = path[:, :levels]
        slots = torch.where(on_path >= 0, draft_slots.gather(1, on_path.clamp_min(0)), -1)
        self.path_tokens = out[:, : levels + 1]
        flat = torch.cat([m[:, None], on_path, out[:, : levels + 1], slots], 1).tolist()
        return [(f[0], f[1 : 1 + f[0]], f[1 + levels : 2 + 2 * levels], f[2 + 2 * levels :]) for f in flat]

    def path_token(self, r: int, index: int) -> torch.Tensor:
        return self.path_tokens[r, index]

    def _choose(self, probs: torch.Tensor) -> torch.Tensor:
        if self.config.greedy:
            return probs.argmax(-1)
        from .verify import sample_from_weights

        return sample_from_weights(probs, list(self.generators))

    def _children(self, probs: torch.Tensor, per_row: int) -> torch.Tensor:
        """``width`` children for each of the ``per_row`` rows of ``probs [G * per_row, V]`` of every row (Long
        ``[G, per_row * width]``), each row's draws from its own generator in ``decode_tree``'s order."""
        decoder, width, config = self.decoder, self.width, self.config
        g = len(self.generators)
        if not config.greedy and decoder.tree_scheme == "recursive":  # the race's rows take one generator: row by row
            kids = [decoder.children(probs[b * per_row : (b + 1) * per_row], width, config, self.generators[b])
                    for b in range(g)]
            return torch.stack([k.reshape(-1) for k in kids])
        gens = [gen for gen in self.generators for _ in range(per_row * width)]
        return decoder.children(probs, width, config, gens).reshape(g, per_row * width)

    def grow(self):
        """Every row's tree (``decode_tree``'s :meth:`grow_levels`, row-wise): tokens, parents, q rows ``[G, n(, V)]``
        and the draft slot each node was fed at (-1: never)."""
        decoder, width, config, dc = self.decoder, self.width, self.config, self.draft_cache
        logits = dc.feed(self.pending)[:, -1]  # [G, V]
        self.draft_calls = 1
        g = logits.shape[0]
        tree_start = list(dc.tentative)
        n = tree_nodes(self.levels, width)
        draft_slots = torch.full((g, n), -1, dtype=torch.long, device=logits.device)
        sample_probs, q = decoder.draft_probs(logits, config)
        kids = self._children(sample_probs, 1)  # [G, w]
        tokens, parents, qs = [kids], [kids.new_full((g, width), -1)], [q[:, None].expand(g, width, -1)]
        scores = q.gather(1, kids)
        offset = 0
        fed: list[torch.Tensor] = []
        path_ids: list[torch.Tensor] = []
        steps = torch.arange(width, device=logits.device)
        starts = torch.tensor(tree_start, dtype=torch.long, device=logits.device)[:, None]
        for level in range(1, self.levels):
            chosen = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :width].sort(-1).values
            nodes = offset + chosen  # [G, w]
            fed_of = fed_parents(level, chosen, width) if level > 1 else chosen.new_full((g, width), -1)
            fed.append(fed_of)
            level_tokens = tokens[-1].gather(1, chosen)
            rows = dc.feed_tree(level_tokens, torch.cat(fed, 1), tree_start)  # [G, w, V]
            self.draft_calls += 1
            draft_slots.scatter_(1, nodes, starts + (level - 1) * width + steps)
            parent_ids = fed_of if level == 1 else torch.cat(path_ids, 1).gather(1, fed_of)
            rows, first = same_path_rows(rows, parent_ids, level_tokens)
            path_ids.append((level - 1) * width + first)
            sample_probs, q = decoder.draft_probs(rows, config)
            kids = self._children(sample_probs.reshape(g * width, -1), width)  # [G, w * w]
            offset += tokens[-1].shape[1]
            tokens.append(kids)
            parents.append(nodes.repeat_interleave(width, 1))
            qs.append(q.repeat_interleave(width, 1))
            scores = scores.gather(1, chosen).repeat_interleave(width, 1) * q.reshape(g * width, -1).gather(
                1, kids.reshape(g * width, width)).reshape(g, -1)
        return torch.cat(tokens, 1), torch.cat(parents, 1), torch.cat(qs, 1), draft_slots

    def verify(self, tokens: torch.Tensor, parents: torch.Tensor, qs: torch.Tensor):
        """One target forward over every row's ``[pending, nodes]``, then the tree verifier (per-row generators)."""
        g = tokens.shape[0]
        block_parents = torch.cat([parents.new_full((g, 1), -1), torch.where(parents < 0, 0, parents + 1)], 1)
        logits = self.target_cache.feed_tree(torch.cat([self.pending, tokens], 1), block_parents, list(self.starts))
        rows = self.decoder.target_rows(logits, self.config)
        draft_probs = None if self.config.greedy else qs
        return self.decoder.tree_verifier(tokens, parents, draft_probs, rows, generator=list(self.generators),
                                          validate=False)

    def repair(self, target_cache: RowCaches, draft_cache: RowCaches, rows: list) -> int:
        """Both caches keep each row's committed text but its new pending token: ``rows`` holds ``(row, kept, kept path
        nodes, their draft slots)``. Returns the draft calls (the plain step's one, or the catch-up feed's)."""
        rows = sorted(rows)
        starts = self.starts
        if self.levels == 0:
            lengths = [starts[r] + kept for r, kept, _, _ in rows]
            target_cache.commit(lengths)
            draft_cache.commit(lengths)
            return 1
        new_lens = [starts[r] + 1 + len(path) for r, _, path, _ in rows]
        target_cache.compact([[starts[r]] + [starts[r] + 1 + node for node in path] for r, _, path, _ in rows])
        target_cache.commit(new_lens)
        fed = [[s for s in slots[: len(path)] if s >= 0] for _, _, path, slots in rows]
        draft_cache.compact([[starts[r]] + f for (r, _, _, _), f in zip(rows, fed)])
        missing = [len(path) - len(f) for (_, _, path, _), f in zip(rows, fed)]
        calls = 0
        if max(missing) > 0:  # path nodes the draft never fed (a last-level leaf): fed now, padded to the longest
            width = max(missing)
            ids = torch.stack([torch.cat([self.path_tokens[r, len(f) : len(f) + n],
                                          self.path_tokens.new_zeros(width - n)])
                               for (r, _, _, _), f, n in zip(rows, fed, missing)])
            draft_cache.feed(ids)
            calls = 1
        draft_cache.commit(new_lens)
        return calls
