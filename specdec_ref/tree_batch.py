"""Batched tree speculative decoding: many requests per call, each row its own tree, lengths and generator.

:func:`decode_tree_batch` runs the rounds of :class:`~specdec_ref.tree_decode.TreeSpeculativeDecoder` for every
request at once: one draft call per level and one target call per round for the whole batch, each row's nodes
written at its own slots with its own tree mask and depth positions (:meth:`RowCaches.feed_tree`), the tree verifier
on all rows, one host sync, then each row's path compacted in place (:meth:`RowCaches.compact`). Rows whose round has
another shape (near the position limit) or another sampling setting run as their own group that round.

Invariant (the contract's batch invariance): a seeded request gives bit for bit what ``decode_tree`` gives it alone.
Its draws come from its own generator in the same order: each level's children, then the verifier's final-sample
exponentials, then its coins (``decode_tree`` verifies with the one-row list ``[generator]``, the per-row order).
Drafters: a draft model (:class:`_ModelDrafter`, its own row cache) and Medusa heads (:class:`_MedusaDrafter`: no
draft forward, each row's feature is the target's hidden state at its last kept node); EAGLE-family heads decode one
request at a time (``decode_tree``). No history-dependent settings (as ``decode_tree``).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .contract import DecodeResult, NotSupportedError, Request, RoundHook
from .decode import _open_row_caches, _truncate, end_round
from .draft_tree import fed_parents, same_path_rows, tree_nodes
from .models import model_dims
from .proposers import proposer_kind
from .decode_inputs import _Batch, validate_requests
from .row_cache import RowCaches
from .tree_heads import HeadsView
from .verify import sample_from_weights

__all__ = ["decode_tree_batch"]


@torch.inference_mode()  # no autograd bookkeeping on the loop's small ops (results are host lists)
def decode_tree_batch(decoder, target, draft, requests: Sequence[Request], *, depth: int, width: int,
                      on_round: RoundHook | None = None) -> list[DecodeResult]:
    """Tree speculative decoding of every request (module docstring); one :class:`DecodeResult` per request, in order.
    ``on_round(record, target_cache, draft_cache)`` runs after every round for every row still in the batch."""
    for name, value in (("depth", depth), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    kind = proposer_kind(draft)
    if kind not in ("draft_model", "medusa"):
        raise NotSupportedError(f"decode_tree_batch drafts trees with a draft model or Medusa heads; {kind} trees decode "
                                "one request at a time (decode_tree)")
    if kind == "medusa":
        depth = min(depth, len(draft.lm_heads))
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
    sub = batch.rows(live)
    tokens = sub.tokens
    extra = tree_nodes(depth, width)
    drafter_type = _ModelDrafter if kind == "draft_model" else _MedusaDrafter
    target_cache, fed = _open_row_caches(decoder.make_cache, target, sub, extra, tokens, drafter_type.capture(draft))
    drafter = drafter_type.open(decoder, draft, sub, extra, tokens, target_cache)
    limit = min(c.max_positions or 1 << 30 for c in (target_cache.cache, drafter.cache_model))
    calls = {"target": int(fed), "draft": int(fed) if kind == "draft_model" else 0}
    committed = [len(t) for t in sub.tokens]
    pending = sub.pending()
    while live:
        starts = [c - 1 for c in committed]  # each row's pending-token slot
        ready = drafter.ready()
        shapes = [decoder.shape(depth, width, sub.max_new[j] - len(results[i].tokens), limit - starts[j])
                  if ready[j] else (0, width) for j, i in enumerate(live)]
        groups: dict = {}
        for j in range(len(live)):
            groups.setdefault((shapes[j], sub.configs[j]), []).append(j)
        outcome: list = [None] * len(live)
        whole = len(groups) == 1
        parts = []
        for ((levels, kids), config), rows in groups.items():
            part = _Round(decoder, target_cache if whole else target_cache.take(rows), drafter if whole else drafter.take(rows),
                          pending if whole else pending[rows], [starts[j] for j in rows], levels, kids, config,
                          [sub.generators[j] for j in rows])
            flat = part.run()  # the one host sync of the group's round
            for r, j in enumerate(rows):
                outcome[j] = (part, r, flat[r])
            parts.append((part, rows))
        calls["target"] += len(groups)
        calls["draft"] += sum(part.draft_calls for part, _ in parts)
        # every row's tokens, then each group's repair (compaction and the drafter's catch-up), as decode_tree does
        done, emitted_of, finals = [], [], []
        repairs: dict = {id(part): [] for part, _ in parts}
        for j, i in enumerate(live):
            part, r, (accepted, path, row, slots, drafted) = outcome[j]
            res = results[i]
            untruncated = [x for x in row if x >= 0][: sub.max_new[j] - len(res.tokens)]
            emitted, hit_eos = _truncate(untruncated, sub.eos[j])
            kept = decoder.kept_in_cache(emitted, untruncated)
            repairs[id(part)].append((r, kept, path[: kept - 1], slots))
            res.tokens.extend(emitted)
            res.host_syncs += 1
            committed[j] += len(emitted)
            emitted_of.append(emitted)
            finals.append((part, accepted, hit_eos, drafted))
            done.append(hit_eos or len(res.tokens) >= sub.max_new[j])
        for part, rows in parts:
            calls["draft"] += part.repair(repairs[id(part)])
            if not whole:  # the group ran on copies of its rows (disjoint from the other groups'): written back
                target_cache.put(rows, part.target_cache)
                drafter.put(rows, part.drafter)
        pending = torch.empty_like(pending)  # each row's last emitted token: one gather per group
        for part, rows in parts:
            last = torch.tensor([[len(emitted_of[j]) - 1] for j in rows], dtype=torch.long, device=pending.device)
            pending[rows] = part.path_tokens.gather(1, last)
        for j, i in enumerate(live):
            part, accepted, hit_eos, (nodes, parents, probs) = finals[j]
            res = results[i]
            res.target_calls, res.draft_calls = calls["target"], calls["draft"]
            end_round(res, on_round, target_cache.row(j), drafter.view(j), start=starts[j] + 1,
                      proposed=part.size, accepted=accepted, emitted=len(emitted_of[j]), committed=committed[j],
                      hit_eos=hit_eos, row=i, drafts=nodes, parents=parents, draft_probs=probs)
        stay = [j for j, d in enumerate(done) if not d]
        if len(stay) < len(live):
            live = [live[j] for j in stay]
            sub.keep(stay)
            committed = [committed[j] for j in stay]
            target_cache.select(stay)
            drafter.select(stay)
            pending = pending[stay] if stay else pending[:0]
    return results


class _ModelDrafter:
    """A draft model's side of the batch: its own cache of the rows (:class:`RowCaches`)."""

    calls_per_level = 1

    def __init__(self, decoder, cache: RowCaches):
        self.decoder, self.cache = decoder, cache

    @staticmethod
    def capture(draft) -> tuple:
        return ()

    @classmethod
    def open(cls, decoder, draft, sub: _Batch, extra: int, tokens, target_cache) -> "_ModelDrafter":
        return cls(decoder, _open_row_caches(decoder.make_draft_cache, draft, sub, extra, tokens)[0])

    @property
    def cache_model(self):
        return self.cache.cache

    def ready(self) -> list[bool]:
        return [True] * self.cache.batch_size

    def take(self, rows) -> "_ModelDrafter":
        return _ModelDrafter(self.decoder, self.cache.take(rows))

    def put(self, rows, part: "_ModelDrafter") -> None:
        self.cache.put(rows, part.cache)

    def select(self, rows) -> None:
        self.cache.select(rows)

    def view(self, j: int):
        return self.cache.row(j)

    def plain(self, pending: torch.Tensor) -> None:
        self.cache.feed(pending)  # the draft follows the pending token (its call is counted by the repair)

    def root(self, pending: torch.Tensor, levels: int, config):
        """``(sample from, q)`` ``[G, V]`` of the root's children: the draft fed the pending token."""
        logits = self.cache.feed(pending)[:, -1]
        self.tree_start = list(self.cache.tentative)
        self.fed, self.path_ids = [], []
        return self.decoder.draft_probs(logits, config)

    def level(self, level: int, chosen: torch.Tensor, level_tokens: torch.Tensor, width: int, config):
        """``(sample from, q)`` ``[G, w, V]`` of the expanded nodes ``chosen`` (fed to the draft in one tree forward;
        same-path nodes share one row) and the slots they were fed at."""
        g = chosen.shape[0]
        fed_of = fed_parents(level, chosen, width) if level > 1 else chosen.new_full((g, width), -1)
        self.fed.append(fed_of)
        rows = self.cache.feed_tree(level_tokens, torch.cat(self.fed, 1), self.tree_start)  # [G, w, V]
        if not (config.greedy or self.decoder.tree_scheme == "deterministic"):  # else siblings are distinct tokens
            parent_ids = fed_of if level == 1 else torch.cat(self.path_ids, 1).gather(1, fed_of)
            rows, first = same_path_rows(rows, parent_ids, level_tokens)
            self.path_ids.append((level - 1) * width + first)
        starts = torch.tensor(self.tree_start, dtype=torch.long, device=chosen.device)[:, None]
        return self.decoder.draft_probs(rows, config), starts + (level - 1) * width + torch.arange(width, device=chosen.device)

    def repair(self, part: "_Round", rows: list) -> int:
        """The draft's cache keeps each row's committed text but the pending token: the plain step's call, or the path
        compacted to its fed nodes and the nodes it never fed (a last-level leaf) fed now, padded to the longest."""
        starts, cache = part.starts, self.cache
        if part.levels == 0:
            cache.commit([starts[r] + kept for r, kept, _, _ in rows])
            return 1
        fed = [[s for s in slots[: len(path)] if s >= 0] for _, _, path, slots in rows]
        cache.compact([[starts[r]] + f for (r, _, _, _), f in zip(rows, fed)])
        missing = [len(path) - len(f) for (_, _, path, _), f in zip(rows, fed)]
        calls = 0
        if max(missing) > 0:
            width = max(missing)
            ids = torch.stack([torch.cat([part.path_tokens[r, len(f) : len(f) + n], part.path_tokens.new_zeros(width - n)])
                               for (r, _, _, _), f, n in zip(rows, fed, missing)])
            cache.feed(ids)
            calls = 1
        cache.commit([starts[r] + 1 + len(path) for r, _, path, _ in rows])
        return calls


class _MedusaDrafter:
    """Medusa heads' side of the batch (:class:`~specdec_ref.tree_heads.MedusaTrees` per row): each row's feature (the
    target's hidden state that produced its pending token), no draft forward; ``None`` before the first target forward
    of a one-token prompt (that round is a plain target step)."""

    calls_per_level = 0

    def __init__(self, decoder, spec, target_cache: RowCaches, features: list):
        self.decoder, self.spec, self.target_cache, self.features = decoder, spec, target_cache, features
        self.proposer = spec.proposer_type.__new__(spec.proposer_type)  # the head arithmetic only
        self.proposer.spec = spec
        self.layer = spec.target_capture[0]

    @staticmethod
    def capture(draft) -> tuple:
        return (draft.target_capture[0],)

    @classmethod
    def open(cls, decoder, spec, sub: _Batch, extra: int, tokens, target_cache: RowCaches) -> "_MedusaDrafter":
        layer = spec.target_capture[0]
        captured = target_cache.cache.captured.get(layer) if target_cache.cache.captured else None
        features = [None if len(t) < 2 else _as_float(captured[b, len(t) - 2]) for b, t in enumerate(tokens)]
        return cls(decoder, spec, target_cache, features)

    @property
    def cache_model(self):
        return self.target_cache.cache

    def ready(self) -> list[bool]:
        return [f is not None for f in self.features]

    def take(self, rows) -> "_MedusaDrafter":
        return _MedusaDrafter(self.decoder, self.spec, None, [self.features[j] for j in rows])

    def put(self, rows, part: "_MedusaDrafter") -> None:
        for r, j in enumerate(rows):
            self.features[j] = part.features[r]

    def select(self, rows) -> None:
        self.features = [self.features[j] for j in rows]

    def view(self, j: int):
        return HeadsView(self.target_cache.row(j))

    def plain(self, pending: torch.Tensor) -> None:
        pass

    def root(self, pending: torch.Tensor, levels: int, config):
        feature = torch.stack(self.features).to(self.spec.lm_heads[0].dtype)  # [G, H]
        self.rows = self.decoder.medusa_rows(self.proposer, feature, levels, config)
        return self.rows[0]

    def level(self, level: int, chosen: torch.Tensor, level_tokens: torch.Tensor, width: int, config):
        g = chosen.shape[0]
        probs = tuple(r[:, None].expand(g, width, -1) for r in self.rows[level])
        return probs, torch.full((g, width), -1, dtype=torch.long, device=chosen.device)

    def repair(self, part: "_Round", rows: list) -> int:
        """The next features: each row's target hidden state at its last kept node (the pending token's when none was
        kept; the plain step's position). No drafter call."""
        block = part.block  # the group's target forward: [G, 1 (+ n), H]
        for r, _, path, _ in rows:
            self.features[r] = block[r, -1] if part.levels == 0 else self.decoder.head_feature(block[r], path)[0]
        return 0


def _as_float(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype != torch.float32 else x.clone()
class _Round:
    """One round of a group of rows that share the tree's shape and the sampling setting (module docstring)."""

    def __init__(self, decoder, target_cache: RowCaches, drafter, pending: torch.Tensor, starts: list[int], levels: int,
                 width: int, config, generators: list):
        self.decoder, self.target_cache, self.drafter = decoder, target_cache, drafter
        self.pending, self.starts, self.levels, self.width = pending, starts, levels, width
        self.config, self.generators = config, generators
        self.size, self.draft_calls, self.block = 0, 0, None

    def run(self) -> list:
        """``(accepted, path, row tokens, path nodes' draft slots, (node tokens, parents, node probabilities))`` per row
        (host lists, one read)."""
        if self.levels == 0:  # no room for a tree (or no feature yet): a plain target step
            self.drafter.plain(self.pending)
            logits = self.target_cache.feed(self.pending)
            self._keep_block()
            final = self._choose(self.decoder.target_rows(logits, self.config)[:, -1])
            self.path_tokens = final[:, None]
            return [(0, [], [x], [], ([], [], [])) for x in final.tolist()]
        tokens, parents, qs, draft_slots = self.grow()
        self.size = tokens.shape[1]
        m, path, out = self.verify(tokens, parents, qs)
        levels = self.levels
        on_path = path[:, :levels]
        slots = torch.where(on_path >= 0, draft_slots.gather(1, on_path.clamp_min(0)), -1)
        self.path_tokens = out[:, : levels + 1]
        ids = torch.cat([m[:, None], on_path, out[:, : levels + 1], slots, tokens, parents], 1)
        node_q = qs.gather(2, tokens[..., None])[..., 0]
        flat = torch.cat([ids.double(), node_q.double()], 1).tolist()  # the nodes and their q too (the round's record)
        n, width = self.size, ids.shape[1]
        rows = []
        for f in flat:
            a = [int(x) for x in f[:width]]
            tree = (a[2 + 3 * levels : 2 + 3 * levels + n], a[2 + 3 * levels + n :], f[width:])
            rows.append((a[0], a[1 : 1 + a[0]], a[1 + levels : 2 + 2 * levels], a[2 + 2 * levels : 2 + 3 * levels], tree))
        return rows

    def _keep_block(self) -> None:
        """The hidden states a heads' drafter reads next (Medusa: the target's, of this forward)."""
        if isinstance(self.drafter, _MedusaDrafter):
            self.block = _as_float(self.target_cache.cache.captured[self.drafter.layer])

    def _choose(self, probs: torch.Tensor) -> torch.Tensor:
        if self.config.greedy:
            return probs.argmax(-1)
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
        width, config, drafter = self.width, self.config, self.drafter
        sample_probs, q = drafter.root(self.pending, self.levels, config)  # [G, V]
        self.draft_calls = drafter.calls_per_level
        g = q.shape[0]
        draft_slots = torch.full((g, tree_nodes(self.levels, width)), -1, dtype=torch.long, device=q.device)
        kids = self._children(sample_probs, 1)  # [G, w]
        tokens, parents, qs = [kids], [kids.new_full((g, width), -1)], [q[:, None].expand(g, width, -1)]
        scores = q.gather(1, kids)
        offset = 0
        for level in range(1, self.levels):
            chosen = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :width].sort(-1).values
            nodes = offset + chosen  # [G, w]
            (sample_probs, q), fed_at = drafter.level(level, chosen, tokens[-1].gather(1, chosen), width, config)
            self.draft_calls += drafter.calls_per_level
            draft_slots.scatter_(1, nodes, fed_at)
            kids = self._children(sample_probs.reshape(g * width, -1), width)  # [G, w * w]
            offset += tokens[-1].shape[1]
            tokens.append(kids)
            parents.append(nodes.repeat_interleave(width, 1))
            qs.append(q.repeat_interleave(width, 1))
            scores = self.decoder.child_scores(scores.gather(1, chosen).repeat_interleave(width, 1), q.reshape(
                g * width, -1).gather(1, kids.reshape(g * width, width)).reshape(g, -1))
        return torch.cat(tokens, 1), torch.cat(parents, 1), torch.cat(qs, 1), draft_slots

    def verify(self, tokens: torch.Tensor, parents: torch.Tensor, qs: torch.Tensor):
        """One target forward over every row's ``[pending, nodes]``, then the tree verifier (per-row generators)."""
        g = tokens.shape[0]
        block_parents = torch.cat([parents.new_full((g, 1), -1), torch.where(parents < 0, 0, parents + 1)], 1)
        logits = self.target_cache.feed_tree(torch.cat([self.pending, tokens], 1), block_parents, list(self.starts))
        self._keep_block()
        rows = self.decoder.target_rows(logits, self.config)
        draft_probs = None if self.config.greedy else qs
        return self.decoder.tree_verifier(tokens, parents, draft_probs, rows, generator=list(self.generators),
                                          validate=False)

    def repair(self, rows: list) -> int:
        """Both caches keep each row's committed text but its new pending token: ``rows`` holds ``(row, kept, kept path
        nodes, their draft slots)``. The target's cache is compacted here, the drafter's side by the drafter; returns
        its calls (the plain step's one, or the catch-up feed's)."""
        rows = sorted(rows)
        starts = self.starts
        if self.levels == 0:
            self.target_cache.commit([starts[r] + kept for r, kept, _, _ in rows])
        else:
            self.target_cache.compact([[starts[r]] + [starts[r] + 1 + node for node in path] for r, _, path, _ in rows])
            self.target_cache.commit([starts[r] + 1 + len(path) for r, _, path, _ in rows])
        return self.drafter.repair(self, rows)
