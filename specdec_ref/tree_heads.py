"""The tree decoder drafting with heads on the target's features: Medusa's trees and EAGLE-2's dynamic trees.

:class:`~specdec_ref.tree_decode.TreeSpeculativeDecoder` runs its rounds with :class:`MedusaTrees` as the drafter when
``draft`` is a :class:`~specdec_ref.heads.MedusaHeads` spec (with a draft model: ``DraftModelTrees``). One round, in the tree decoder's conventions (``C`` committed tokens, the
last one pending; the target's cache holds the other ``C - 1``):

1. **draft** (no forward): head ``l`` (``l = 0 .. depth - 1``) reads the feature that produced the pending token (the
   target's hidden state at the last position it read, :data:`~specdec_ref.static_cache.FINAL` by default) and gives
   the row ``q_l`` every node of level ``l + 1`` draws its children from: Medusa's heads do not read the path, so the
   children of level ``l + 1`` follow the same row whatever their parent. The tree grows as with a draft model: the
   root gets ``width`` children by the verifier's tree scheme (:meth:`TreeSpeculativeDecoder.children`), each further
   level expands the ``width`` nodes of the previous one with the highest cumulative ``q`` (the decoder's
   :meth:`~TreeSpeculativeDecoder.expand`), each with ``width`` children of its own. ``depth`` is capped at the number
   of heads.
2. **verify**: the target's tree forward and the tree verifier, exactly as with a draft model.
3. **repair**: the target's cache keeps the committed prefix, the pending token and the accepted path (compaction);
   the next round's feature is the target's hidden state at the *last kept node* of the block (the pending token's
   position when nothing was accepted), never at the block's last node.

:class:`HeadTrees` drafts with an EAGLE, EAGLE-3 or MTP head (EAGLE-2's dynamic trees; the chain rules of
:mod:`specdec_ref.heads`). One round:

1. **draft**: the head's catch-up reads the pairs committed since its last read (token ``c_j`` with the target's feature
   ``f_j-1``; EAGLE-3 fuses its layers here) into its own cache; its hidden state at the pending token gives the row of
   the root's ``width`` children. Each further level feeds the ``width`` expanded nodes (highest cumulative ``q``, as
   for every tree) to the head in ONE tree-attention forward (``feed_tree``: a node sees the committed pairs, its
   ancestors and itself, at position ``tree_start + depth``), each node paired with the hidden state that produced
   *its own* row (its parent's output), and each node's output gives its children's row.
2. **verify** as for every tree.
3. **repair**: the target's cache keeps the pending token and the accepted path; the head's cache drops every tree
   node (they ran on the head's own features) and keeps the committed pairs; the round's committed tokens are queued
   for the next catch-up with the target's features of the pending token and of the accepted path's nodes
   (:meth:`~specdec_ref.tree_decode.TreeSpeculativeDecoder.path_features`), never a rejected branch's.

A prompt of one token has no feature before the first target forward: that round is a plain target step (as in the
chain decoder). The invariant after every round (``on_round``): the target's cache holds ``committed_len - 1`` tokens,
and the heads' view (``draft_cache`` of the hook) reports the same length.
"""
from __future__ import annotations

import torch

from .contract import DecodeResult, NotSupportedError
from .draft_tree import DraftTree, fed_parents, tree_nodes
from .draws import choose as _choose
from .models import model_dims

__all__ = ["MedusaTrees", "HeadTrees", "HeadsView", "grow_medusa_tree"]


class HeadsView:
    """The heads' row view for ``on_round``: the target cache's length (the committed text but the pending token); no
    K/V."""

    def __init__(self, target_cache):
        self._cache = target_cache

    @property
    def tentative_length(self) -> int:
        return self._cache.tentative_length

    committed_length = tentative_length

    def layer_kv(self) -> list:
        return []


def grow_medusa_tree(decoder, proposer, feature: torch.Tensor, depth: int, width: int, sampling, generator) -> DraftTree:
    """The draft tree of one round (module docstring, step 1): ``feature [1, H]``."""
    rows = decoder.medusa_rows(proposer, feature, depth, sampling)
    tokens, parents, qs = decoder.grow_levels(
        rows[0], depth, width, sampling, generator,
        lambda level, chosen, nodes, kids: tuple(r.expand(width, -1) for r in rows[level]))
    return DraftTree(tokens, parents, qs, torch.full((tree_nodes(depth, width),), -1, dtype=torch.long,
                                                     device=tokens.device), 0)


class MedusaTrees:
    """The Medusa heads' side of the tree decoder's rounds (module docstring): the target's features, no draft cache."""

    def __init__(self, decoder, target_cache, spec, feature: torch.Tensor | None):
        self.decoder, self.target_cache, self.view = decoder, target_cache, HeadsView(target_cache)
        self.proposer = spec.proposer_type.__new__(spec.proposer_type)  # the head arithmetic only (no rows, no backlog)
        self.proposer.spec = spec
        self.layer = spec.target_capture[0]
        self.feature = feature

    @classmethod
    def open(cls, decoder, target, spec, prompt: torch.Tensor, needed: int, result: DecodeResult) -> "MedusaTrees":
        """The target's cache holding the prompt but its last token, capturing the heads' feature layer."""
        layer = spec.target_capture[0]
        cache, prefill = _open_target(decoder, target, spec, prompt, needed, (layer,), result)
        return cls(decoder, cache, spec, prefill[layer][:, -1] if prefill else None)

    def ready(self) -> bool:
        """A feature to draft from (a one-token prompt has none before the first target forward)."""
        return self.feature is not None

    def plain(self, pending, sampling, generator) -> torch.Tensor:
        return _plain_step(self, pending, sampling, generator)

    def grow(self, pending, levels, width, sampling, generator) -> DraftTree:
        return grow_medusa_tree(self.decoder, self.proposer, self.feature, levels, width, sampling, generator)

    def repair(self, start: int, kept: int, plain: bool, path: list[int], slots: list[int], path_tokens,
               emitted: list[int]) -> int:
        """The target's cache keeps the pending token and the kept path (compaction); the next feature is the target's
        at the last kept position (:meth:`~specdec_ref.tree_decode.TreeSpeculativeDecoder.head_feature`). No drafter
        call."""
        block = self.target_cache.features()[self.layer][0]  # of the last forward: [1 (+ n), H]
        if plain:
            self.feature = block[None, -1]
        else:
            self.target_cache.compact(self.decoder.target_keep(start, path))
            self.feature = self.decoder.head_feature(block, path)
        self.target_cache.commit(start + kept)
        return 0


def _plain_step(trees, pending, sampling, generator) -> torch.Tensor:
    """A plain target step of a heads' drafter: the pending token fed to the target, the next token drawn from its
    warped row (the target's features of that position are captured for the next round)."""
    logits = trees.target_cache.feed(pending)
    return _choose(trees.decoder.target_rows(logits, sampling)[:, -1], sampling, generator)


def _open_target(decoder, target, spec, prompt: torch.Tensor, needed: int, capture: tuple, result: DecodeResult):
    """The target's cache holding the prompt but its last token, capturing ``capture``; ``(cache, prefill features)``."""
    cache = decoder.make_cache(target, check_ids=False, max_length=min(needed, model_dims(target)["max_positions"] or needed))
    if not hasattr(cache, "features"):
        raise NotSupportedError(f"{spec.name} trees read the target's hidden states: they need the lean forward (llama / "
                                f"qwen2), not {type(cache).__name__}")
    cache.capture = capture
    prefill = {}
    t = prompt.shape[1]
    if t > 1:
        cache.feed(prompt[:, :-1])
        result.target_calls += 1
        prefill = cache.features()
    cache.commit(t - 1)
    return cache, prefill


class HeadTrees:
    """An EAGLE / EAGLE-3 / MTP head's side of the tree decoder's rounds (module docstring): the head's own proposer
    (its arithmetic, backlog and cache), one row per expanded node."""

    def __init__(self, decoder, target_cache, proposer):
        self.decoder, self.target_cache, self.proposer = decoder, target_cache, proposer
        self.view = HeadsView(target_cache)
        self.keep_head: int | None = None

    @classmethod
    def open(cls, decoder, target, spec, prompt: torch.Tensor, needed: int, result: DecodeResult) -> "HeadTrees":
        from .row_cache import RowCaches

        cache, prefill = _open_target(decoder, target, spec, prompt, needed, spec.target_capture, result)
        head_cache = None
        if spec.layers is not None:
            head_cache = RowCaches(decoder.make_draft_cache(spec.layers, check_ids=False, max_length=needed))
        t = prompt.shape[1]
        proposer = spec.proposer_type(decoder.draft_probs, spec, target, [t - 1], [prompt[0].tolist()], prefill, head_cache)
        return cls(decoder, cache, proposer)

    def ready(self) -> bool:
        return self.proposer.ready()

    def plain(self, pending, sampling, generator) -> torch.Tensor:
        return _plain_step(self, pending, sampling, generator)

    def catch_up(self) -> torch.Tensor:
        """The head reads its backlog into its cache (committed there); its hidden state at the pending token ``[1, H]``."""
        p = self.proposer
        tokens, features = p.backlog[0]
        n = len(tokens)
        ids = torch.tensor([tokens], dtype=torch.long, device=p.device)
        positions = p.lengths[0] - n + torch.arange(n, device=p.device)[None]  # pair (c_j, f_j-1) at position j - 1
        hidden = p.step(ids, p.first_features(features[None]), positions)
        if p.head_cache is not None:
            p.head_cache.commit(p.head_cache.tentative)
            self.keep_head = p.head_cache.tentative[0]
        p.backlog = [([], None)]
        return hidden[:, -1]

    def grow(self, pending, levels, width, sampling, generator) -> DraftTree:
        """The round's tree (module docstring, step 1): one head step for the catch-up and level 1, one per further
        level."""
        decoder, p = self.decoder, self.proposer
        h = self.catch_up()
        produced = [h.expand(width, -1)]  # the head's hidden state that produced each node's row, level by level
        tree_start = self.keep_head if self.keep_head is not None else 0
        fed: list[torch.Tensor] = []

        def level_rows(level, chosen, nodes, tokens):
            fed.append(fed_parents(level, chosen, width))
            features = decoder.node_features(produced[-1], chosen)  # [w, H]
            out = p.step(tokens[None], features[None], None, (torch.cat(fed), tree_start))[0]
            produced.append(out.repeat_interleave(width, 0))
            return decoder.draft_probs(p.logits(out), sampling)

        tokens, parents, qs = decoder.grow_levels(decoder.draft_probs(p.logits(h), sampling), levels, width, sampling,
                                                  generator, level_rows)
        return DraftTree(tokens, parents, qs, torch.full((tree_nodes(levels, width),), -1, dtype=torch.long,
                                                         device=tokens.device), levels)

    def repair(self, start: int, kept: int, plain: bool, path: list[int], slots: list[int], path_tokens,
               emitted: list[int]) -> int:
        """The target's cache keeps the pending token and the kept path; the head's cache drops the tree; the committed
        tokens (``emitted``, host ints) join the head's backlog with the target's features of the positions before
        them. No drafter call."""
        p = self.proposer
        block = p.fused(self.target_cache.features())[0]  # of the last forward: [1 (+ n), H]
        if plain:
            features = block[-1:]
        else:
            self.target_cache.compact(self.decoder.target_keep(start, path))
            features = self.decoder.path_features(block, path)
        self.target_cache.commit(start + kept)
        if p.head_cache is not None and self.keep_head is not None:
            p.head_cache.commit([self.keep_head])  # the tree's nodes ran on the head's own features: dropped
        old_tokens, old_features = p.backlog[0]
        merged = features[:kept] if old_features is None else torch.cat([old_features, features[:kept]])
        p.backlog = [(old_tokens + list(emitted[:kept]), merged)]
        p.lengths = [start + kept]
        return 0
