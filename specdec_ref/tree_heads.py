"""The tree decoder drafting with Medusa heads (Medusa's trees): the heads' rows, the target's features, no draft cache.

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

A prompt of one token has no feature before the first target forward: that round is a plain target step (as in the
chain decoder). The invariant after every round (``on_round``): the target's cache holds ``committed_len - 1`` tokens,
and the heads' view (``draft_cache`` of the hook) reports the same length.
"""
from __future__ import annotations

import torch

from .contract import DecodeResult, NotSupportedError
from .draft_tree import DraftTree, tree_nodes
from .draws import choose as _choose
from .models import model_dims

__all__ = ["MedusaTrees", "grow_medusa_tree"]


class _HeadsView:
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
    sample_probs, q = rows[0]
    kids = decoder.children(sample_probs, width, sampling, generator)  # [1, w]
    device = kids.device
    tokens, parents, qs = [kids.reshape(-1)], [kids.new_full((width,), -1)], [q.expand(width, -1)]
    scores = q.gather(1, kids).reshape(-1)
    offset = 0
    for level in range(1, depth):
        chosen = decoder.expand(scores, width)
        nodes = offset + chosen
        sample_probs, q = rows[level]
        kids = decoder.children(sample_probs.expand(width, -1), width, sampling, generator)  # [w, w]: a row per parent
        offset += tokens[-1].shape[0]
        tokens.append(kids.reshape(-1))
        parents.append(nodes.repeat_interleave(width))
        qs.append(q.expand(width * width, -1))
        scores = scores[chosen].repeat_interleave(width) * q[0][kids.reshape(-1)]
    n = tree_nodes(depth, width)
    return DraftTree(torch.cat(tokens), torch.cat(parents), torch.cat(qs),
                     torch.full((n,), -1, dtype=torch.long, device=device), 0)


class MedusaTrees:
    """The Medusa heads' side of the tree decoder's rounds (module docstring): the target's features, no draft cache."""

    def __init__(self, decoder, target_cache, spec, feature: torch.Tensor | None):
        self.decoder, self.target_cache, self.view = decoder, target_cache, _HeadsView(target_cache)
        self.proposer = spec.proposer_type.__new__(spec.proposer_type)  # the head arithmetic only (no rows, no backlog)
        self.proposer.spec = spec
        self.layer = spec.target_capture[0]
        self.feature = feature

    @classmethod
    def open(cls, decoder, target, spec, prompt: torch.Tensor, needed: int, result: DecodeResult) -> "MedusaTrees":
        """The target's cache holding the prompt but its last token, capturing the heads' feature layer."""
        cache = decoder.make_cache(target, check_ids=False, max_length=min(needed, model_dims(target)["max_positions"] or needed))
        if not hasattr(cache, "features"):
            raise NotSupportedError(f"Medusa trees read the target's hidden states: they need the lean forward (llama / "
                                    f"qwen2), not {type(cache).__name__}")
        trees = cls(decoder, cache, spec, None)
        cache.capture = (trees.layer,)
        t = prompt.shape[1]
        if t > 1:
            cache.feed(prompt[:, :-1])
            result.target_calls += 1
            trees.feature = cache.features()[trees.layer][:, -1]
        cache.commit(t - 1)
        return trees

    def ready(self) -> bool:
        """A feature to draft from (a one-token prompt has none before the first target forward)."""
        return self.feature is not None

    def plain(self, pending, sampling, generator) -> torch.Tensor:
        logits = self.target_cache.feed(pending)
        return _choose(self.decoder.target_rows(logits, sampling)[:, -1], sampling, generator)

    def grow(self, pending, levels, width, sampling, generator) -> DraftTree:
        return grow_medusa_tree(self.decoder, self.proposer, self.feature, levels, width, sampling, generator)

    def repair(self, start: int, kept: int, plain: bool, path: list[int], slots: list[int], path_tokens) -> int:
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
