"""The tree decoder drafting with Medusa heads (Medusa's trees): the heads' rows, the target's features, no draft cache.

:class:`~specdec_ref.tree_decode.TreeSpeculativeDecoder` opens this path when ``draft`` is a
:class:`~specdec_ref.heads.MedusaHeads` spec. One round, in the tree decoder's conventions (``C`` committed tokens, the
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

import time

import torch

from .contract import DecodeResult, NotSupportedError
from .decode import _truncate, end_round
from .draft_tree import DraftTree, tree_nodes
from .draws import choose as _choose
from .models import model_dims

__all__ = ["medusa_tree_decode", "grow_medusa_tree"]


class _HeadsView:
    """The heads' row view for ``on_round``: their length is the committed text but the pending token; no K/V."""

    def __init__(self, length: int):
        self.tentative_length = self.committed_length = length

    def layer_kv(self) -> list:
        return []


def grow_medusa_tree(decoder, proposer, feature: torch.Tensor, depth: int, width: int, sampling, generator):
    """The :class:`~specdec_ref.tree_decode.DraftTree` of one round (module docstring, step 1): ``feature [1, H]``."""
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


def medusa_tree_decode(decoder, target, spec, prompt: torch.Tensor, *, depth: int, width: int, max_new_tokens: int,
                       sampling, eos_id, generator, on_round, timed: bool) -> DecodeResult:
    """Tree decoding of ``prompt`` (validated, ``[1, t]``) with the Medusa heads ``spec`` (module docstring)."""
    depth = min(depth, len(spec.lm_heads))
    t = prompt.shape[1]
    result = DecodeResult(tokens=[], prompt_len=t, finished_by="max_new_tokens")
    if max_new_tokens == 0:
        return result
    clock = time.perf_counter if timed else None
    seconds = {"prefill": 0.0, "draft": 0.0, "verify": 0.0, "repair": 0.0}
    tick = clock() if clock else 0.0
    needed = t + max_new_tokens + tree_nodes(depth, width)
    cache = decoder.make_cache(target, check_ids=False, max_length=min(needed, model_dims(target)["max_positions"] or needed))
    if not hasattr(cache, "features"):
        raise NotSupportedError(f"Medusa trees read the target's hidden states: they need the lean forward (llama / "
                                f"qwen2), not {type(cache).__name__}")
    proposer = spec.proposer_type.__new__(spec.proposer_type)  # the head arithmetic only (no rows, no backlog)
    proposer.spec = spec
    layer = spec.target_capture[0]
    cache.capture = (layer,)
    feature = None
    if t > 1:
        cache.feed(prompt[:, :-1])
        result.target_calls += 1
        feature = cache.features()[layer][:, -1]
    cache.commit(t - 1)
    pending, committed = prompt[:, -1:], t
    if clock:
        seconds["prefill"] += clock() - tick
    while len(result.tokens) < max_new_tokens:
        start = committed - 1
        room = (cache.max_positions - start) if cache.max_positions else None
        levels, kids = decoder.shape(depth, width, max_new_tokens - len(result.tokens), room)
        tick = clock() if clock else 0.0
        if levels == 0 or feature is None:  # no room for a tree, or no feature yet: a plain target step
            logits = cache.feed(pending)
            final = _choose(decoder.target_rows(logits, sampling)[:, -1], sampling, generator)
            result.target_calls += 1
            accepted, path, row, proposed, path_tokens, block = 0, [], [int(final.item())], 0, final[:, None], None
            if clock:
                seconds["verify"] += clock() - tick
        else:
            tree = grow_medusa_tree(decoder, proposer, feature, levels, kids, sampling, generator)
            if clock:
                now = clock()
                seconds["draft"] += now - tick
                tick = now
            m, path_t, tokens = decoder.verify(cache, pending, tree, sampling, generator)
            result.target_calls += 1
            block = cache.features()[layer][0]  # [1 + n, H]: the pending token's position, then the nodes'
            flat = torch.cat([m[:1], path_t[0, :levels], tokens[0, : levels + 1]]).tolist()  # the one host sync
            accepted = flat[0]
            path = flat[1 : 1 + accepted]
            row = flat[1 + levels : 2 + 2 * levels]
            path_tokens = tokens[:, : levels + 1]
            proposed = tree.size
            if clock:
                now = clock()
                seconds["verify"] += now - tick
                tick = now
        result.host_syncs += 1
        untruncated = [x for x in row if x >= 0][: max_new_tokens - len(result.tokens)]
        emitted, hit_eos = _truncate(untruncated, eos_id)
        kept = decoder.kept_in_cache(emitted, untruncated)
        kept_path = path[: kept - 1]
        if block is None:
            cache.commit(start + kept)
            feature = cache.features()[layer][:, -1]
        else:
            cache.compact(decoder.target_keep(start, kept_path))
            cache.commit(start + kept)
            feature = decoder.head_feature(block, kept_path)
        committed += len(emitted)
        result.tokens.extend(emitted)
        pending = path_tokens[:, len(emitted) - 1 : len(emitted)]
        if clock:
            seconds["repair"] += clock() - tick
        if end_round(result, on_round, cache, _HeadsView(committed - 1), start=start + 1, proposed=proposed,
                     accepted=accepted, emitted=len(emitted), committed=committed, hit_eos=hit_eos):
            break
    if timed:
        result.seconds = seconds
    return result
