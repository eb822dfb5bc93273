"""The reference tree speculative decoder: the draft grows a tree (EAGLE-2 style), the target verifies it in one call.

Conventions are the chain decoder's (:mod:`specdec_ref.decode`): ``C`` committed tokens of which the
last one is *pending* (committed, fed to neither cache); both caches hold the other ``L = C - 1``.
One round (batch 1), with ``D`` levels of ``w`` (``width``) children:

1. **draft** (``D`` draft calls): the draft feeds the pending token; its row ``q`` (the warped
   distribution, :func:`specdec_ref.warp.warp`) gives level 1, ``w`` children of the root. Each
   further level: the ``w`` nodes of the previous level with the highest cumulative draft
   probability (the product of the ``q`` of the chosen tokens along the path; ties to the lower node
   index) are fed in ONE draft forward (:meth:`~specdec_ref.cache.ModelCache.feed_tree`: tree
   attention mask, position ids by depth), and each gets ``w`` children from its own row. Level
   ``D``'s nodes are never fed. Children follow the verifier's ``tree_scheme``: ``deterministic``:
   the ``w`` most likely tokens (stable sort, ties to the lower id); ``specinfer``: ``w`` i.i.d.
   samples; ``recursive``: ``w`` samples without replacement (once ``q``'s support is used up, further
   siblings are i.i.d. samples of ``q``: duplicates of rejected tokens, which the verifier never
   accepts and which leave its residual unchanged). Greedy decoding drafts the top ``w`` and verifies
   greedily (``draft_probs=None``). Nodes are in BFS order (level by level; within a level, grouped by
   parent in parent order), so ``parents[i] < i``; ``draft_probs[i]`` is the parent's row.
2. **verify** (one target call): the target feeds ``[pending, nodes]`` with the tree mask and depth
   positions; row 0 (after the pending token) judges the root's children, row ``i + 1`` node ``i``'s
   children; the tree verifier (:mod:`specdec_ref.tree`) returns ``m``, the path and the tokens.
3. **one host sync** reads ``m``, the path, the tokens and the draft slots of the path's nodes.
   EOS anywhere on the path ends generation right after it; ``max_new_tokens`` is never exceeded
   (a round's emitted tokens are cut there, as in the chain decoder).
4. **repair** (KV compaction): both caches keep the committed prefix, the pending token and the
   accepted path's entries moved to contiguous slots (:meth:`~specdec_ref.cache.ModelCache.compact`);
   everything else is dropped. Path nodes the draft never fed (a leaf of the last level, or a node it
   did not expand) are fed to the draft afterwards. The final token is the new pending token.

Invariant after every round (checked by ``on_round(record, target_cache, draft_cache)`` hooks): both
caches hold ``committed_len - 1`` tokens whose K/V equal a fresh prefill of that prefix. Each step is
one overridable method, so a known bug (``fixtures/mutants/tree_decoder.py``) is a one-method subclass.

The tree is shrunk near the caches' position limit (fewer levels, then fewer children) so that the
target's ``1 + n`` slots fit; a round with no room for one level is a plain target step (:meth:`TreeSpeculativeDecoder.plain_step`),
whose token follows the target's warped row as in AR decoding.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from .cache import ModelCache
from .capabilities import TREE_PROPOSER_NAMES
from .contract import DecodeResult, NotSupportedError, RoundHook
from .decode import _truncate, end_round, open_caches
from .draft_tree import DraftTree, fed_parents, same_path_rows, tree_nodes
from .draws import choose as _choose
from .models import model_dims
from .proposers import is_model, proposer_kind
from .decode_inputs import _validate_decode_args
from .static_cache import fastest_cache
from .tree import SpecInferTreeVerifier, TreeVerifierBase
from .tree_batch import decode_tree_batch
from .verify import sample_from_weights
from .warp import GREEDY, SamplingConfig, warp

__all__ = ["TreeSpeculativeDecoder", "DraftTree", "tree_nodes", "tree_speculative_decode"]


class TreeSpeculativeDecoder:
    """Tree speculative decoding (batch 1); one overridable method per step (mutants override one).

    ``tree_verifier`` (default :class:`~specdec_ref.tree.SpecInferTreeVerifier`) decides how children
    are drafted (its ``tree_scheme``) and judges the tree. Caches default to
    :func:`~specdec_ref.static_cache.fastest_cache` (lean static cache for Llama / Qwen2 / GPT-2, the
    transformers ``DynamicCache`` with a 4D tree mask otherwise).
    """

    def __init__(
        self,
        tree_verifier: TreeVerifierBase | None = None,
        make_cache: Callable[..., ModelCache] = fastest_cache,
        make_draft_cache: Callable[..., ModelCache] | None = None,
    ):
        self.tree_verifier = tree_verifier if tree_verifier is not None else SpecInferTreeVerifier()
        self.make_cache = make_cache
        self.make_draft_cache = make_draft_cache or make_cache

    @property
    def tree_scheme(self) -> str:
        return getattr(self.tree_verifier, "tree_scheme", "specinfer")

    # -- steps -------------------------------------------------------------------------
    def draft_probs(self, logits: torch.Tensor, sampling: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
        """(distribution the draft draws children from, distribution reported as their q and scored)."""
        q = warp(logits, sampling)
        return q, q

    def children(self, probs: torch.Tensor, width: int, sampling: SamplingConfig, generator) -> torch.Tensor:
        """``width`` children per row of ``probs[P, V]`` (Long ``[P, width]``), by the verifier's tree scheme."""
        scheme = self.tree_scheme
        if sampling.greedy or scheme == "deterministic":
            return torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :width]
        rows = probs.shape[0]
        iid = sample_from_weights(probs.repeat_interleave(width, 0), generator).view(rows, width)
        if scheme != "recursive":
            return iid
        # without replacement: the exponential race's top-width is sequential sampling without replacement
        race = torch.empty_like(probs).exponential_(generator=generator).clamp_min_(1e-30)
        ordered = torch.sort(probs / race, dim=-1, descending=True, stable=True).indices[:, :width]
        support = (probs > 0).sum(-1, keepdim=True)
        return torch.where(torch.arange(width, device=probs.device) < support, ordered, iid)

    def expand(self, scores: torch.Tensor, width: int) -> torch.Tensor:
        """Indices (ascending) of the ``width`` nodes of a level with the highest cumulative draft
        probability ``scores``; ties go to the lower index."""
        best = torch.sort(scores, descending=True, stable=True).indices[:width]
        return best.sort().values

    def child_scores(self, parent_scores: torch.Tensor, child_q: torch.Tensor) -> torch.Tensor:
        """The cumulative draft probability of new nodes (what :meth:`expand` ranks): their parent's times their own
        ``q`` (each node's probability in the row it was drawn from)."""
        return parent_scores * child_q

    def grow_levels(self, first: tuple, depth: int, width: int, sampling, generator, level_rows) -> tuple:
        """The tree's ``(tokens, parents, draft_probs)`` from the root's ``first = (sample from, q)`` (``[1, V]`` each):
        the root's ``width`` children, then per further level the ``width`` nodes with the highest cumulative ``q``
        (:meth:`expand`), each with ``width`` children from its row; ``level_rows(level, chosen, nodes, tokens)`` gives
        the rows ``[width, V]`` of the chosen nodes (``chosen``: within the level, ``nodes``: tree indices, ``tokens``:
        theirs), feeding them to the drafter if it reads them."""
        sample_probs, q = first
        kids = self.children(sample_probs, width, sampling, generator)  # [1, w]
        tokens, parents, qs = [kids.reshape(-1)], [kids.new_full((width,), -1)], [q.expand(width, -1)]
        scores = q.gather(1, kids).reshape(-1)
        offset = 0
        for level in range(1, depth):
            chosen = self.expand(scores, width)  # within the level
            nodes = offset + chosen
            sample_probs, q = level_rows(level, chosen, nodes, tokens[-1][chosen])  # [w, V]
            kids = self.children(sample_probs, width, sampling, generator)  # [w, w]
            offset += tokens[-1].shape[0]
            tokens.append(kids.reshape(-1))
            parents.append(nodes.repeat_interleave(width))
            qs.append(q.repeat_interleave(width, 0))
            scores = self.child_scores(scores[chosen].repeat_interleave(width), q.gather(1, kids).reshape(-1))
        return torch.cat(tokens), torch.cat(parents), torch.cat(qs)

    def grow(self, draft_cache: ModelCache, pending: torch.Tensor, depth: int, width: int, sampling, generator) -> DraftTree:
        """Feed the pending token and grow ``depth`` levels (one draft call per level; level ``depth`` is not fed)."""
        logits = draft_cache.feed(pending)[:, -1]
        tree_start = draft_cache.tentative_length
        draft_slots = torch.full((tree_nodes(depth, width),), -1, dtype=torch.long, device=logits.device)
        fed: list[torch.Tensor] = []
        path_ids: list[torch.Tensor] = []  # per fed node: the fed index of the first node with its path
        distinct = sampling.greedy or self.tree_scheme == "deterministic"
        steps = torch.arange(width, device=logits.device)

        def level_rows(level, chosen, nodes, tokens):
            parents = fed_parents(level, chosen, width)
            fed.append(parents)
            rows = draft_cache.feed_tree(tokens[None], torch.cat(fed), tree_start=tree_start)[0]
            draft_slots[nodes] = tree_start + (level - 1) * width + steps
            if distinct:  # greedy / deterministic siblings are distinct tokens: every node's path is its own
                return self.draft_probs(rows, sampling)
            parent_ids = parents if level == 1 else torch.cat(path_ids)[parents]
            rows, first = same_path_rows(rows, parent_ids, tokens)
            path_ids.append((level - 1) * width + first)
            return self.draft_probs(rows, sampling)

        tokens, parents, qs = self.grow_levels(self.draft_probs(logits, sampling), depth, width, sampling, generator,
                                               level_rows)
        return DraftTree(tokens, parents, qs, draft_slots, depth)

    def target_rows(self, logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
        """Target rows from the forward of ``[pending, nodes]``: row 0 judges the root's children, row i+1 node i's."""
        return warp(logits, sampling)

    def verify(self, target_cache: ModelCache, pending: torch.Tensor, tree: DraftTree, sampling, generator):
        """One target forward over ``[pending, nodes]`` (tree mask, depth positions), then the tree verifier."""
        parents = torch.cat([tree.parents.new_full((1,), -1), torch.where(tree.parents < 0, 0, tree.parents + 1)])
        logits = target_cache.feed_tree(torch.cat([pending, tree.tokens[None]], 1), parents)
        rows = self.target_rows(logits, sampling)
        qs = None if sampling.greedy else tree.draft_probs[None]
        # a one-row list: the per-row order of draws (final-sample race, then coins), so that the request decodes bit
        # for bit as a row of decode_tree_batch (specdec_ref.tree_batch)
        return self.tree_verifier(tree.tokens[None], tree.parents[None], qs, rows, generator=[generator], validate=False)

    def target_keep(self, start: int, path: list[int]) -> list[int]:
        """Target slots to keep: the pending token's ``start`` and the kept path nodes' ``start + 1 + node``."""
        return [start] + [start + 1 + node for node in path]

    def repair(
        self, target_cache: ModelCache, draft_cache: ModelCache, start: int, path: list[int], draft_slots: list[int],
        path_tokens: torch.Tensor,
    ) -> int:
        """Compact both caches to the prefix, the pending token (slot ``start``) and the kept path nodes
        ``path``; feed the draft the path nodes it never fed. Returns the extra draft calls."""
        new_len = start + 1 + len(path)
        target_cache.compact(self.target_keep(start, path))
        target_cache.commit(new_len)
        fed = [slot for slot in draft_slots[: len(path)] if slot >= 0]  # a prefix of the path (only fed nodes have children)
        draft_cache.compact([start] + fed)
        calls = 0
        if len(fed) < len(path):
            draft_cache.feed(path_tokens[:, len(fed) : len(path)])
            calls = 1
        draft_cache.commit(new_len)
        return calls

    def medusa_rows(self, proposer, feature: torch.Tensor, depth: int, sampling) -> list:
        """Medusa trees: ``(sample from, q)`` of every level (``[1, V]`` each): head ``l``'s logits from ``feature [1, H]``
        through :meth:`draft_probs`."""
        feature = feature.to(proposer.spec.lm_heads[0].dtype)
        return [self.draft_probs(proposer.head(level, feature), sampling) for level in range(depth)]

    def head_feature(self, block: torch.Tensor, kept_path: list[int]) -> torch.Tensor:
        """Medusa trees (:mod:`specdec_ref.tree_heads`): the next round's feature ``[1, H]`` from the verify block's
        target features ``block [1 + n, H]``: the last kept node's (the pending token's when none was kept)."""
        return block[None, 1 + kept_path[-1]] if kept_path else block[None, 0]

    def path_features(self, block: torch.Tensor, kept_path: list[int]) -> torch.Tensor:
        """EAGLE-family trees (:mod:`specdec_ref.tree_heads`): the target's features ``[1 + len(kept_path), H]`` the
        round's committed tokens pair with, from the verify block's ``block [1 + n, H]``: the pending token's, then
        the kept path nodes' (never a rejected branch's)."""
        return block[[0] + [1 + node for node in kept_path]]

    def node_features(self, produced: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """EAGLE-family trees: the features the expanded nodes ``chosen`` are fed with: the head's hidden state that
        produced each one's row (``produced [nodes of the level, H]``, its parent's output)."""
        return produced[chosen]

    def kept_in_cache(self, emitted: list[int], untruncated: list[int]) -> int:
        """How many of this round's tokens the caches must describe: the committed ones, never any after EOS."""
        return len(emitted)

    def plain_step(self, target_cache: ModelCache, draft_cache: ModelCache, pending: torch.Tensor, sampling, generator) -> torch.Tensor:
        """A round without drafts (Long ``[1]``): the pending token fed to both models, the next token drawn from the
        target's warped row as AR decoding would draw it (one draft and one target call)."""
        draft_cache.feed(pending)
        logits = target_cache.feed(pending)
        return _choose(self.target_rows(logits, sampling)[:, -1], sampling, generator)

    def shape(self, depth: int, width: int, remaining: int, room: int | None) -> tuple[int, int]:
        """(levels, width) of this round: ``depth`` levels (the emitted tokens are cut at ``max_new_tokens``, as in the
        chain decoder) while ``1 + nodes <= room`` target slots."""
        if room is None:
            return depth, width
        while depth > 0 and 1 + tree_nodes(depth, width) > room:
            depth -= 1
        if depth == 0 and remaining > 1 and room >= 2:
            return 1, min(width, room - 1)
        return depth, width

    # -- loop ----------------------------------------------------------------------------
    @torch.inference_mode()  # no autograd bookkeeping on the loop's small ops (results are host lists)
    def decode(
        self,
        target,
        draft,
        prompt,
        *,
        depth: int,
        width: int,
        max_new_tokens: int,
        sampling: SamplingConfig = GREEDY,
        eos_id: int | None = None,
        generator: torch.Generator | None = None,
        on_round: RoundHook | None = None,
        timed: bool = False,
    ) -> DecodeResult:
        """Tree speculative decoding of ``prompt`` (batch 1): ``depth`` levels of ``width`` children per round.

        Same result, records, hooks and validation as :meth:`specdec_ref.decode.SpeculativeDecoder.decode`;
        ``RoundRecord.proposed`` is the number of tree nodes, ``accepted`` the accepted path length ``m``.
        """
        for name, value in (("depth", depth), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        prompt = _validate_decode_args(target, draft, prompt, depth, max_new_tokens, eos_id, sampling)
        vocab = model_dims(target)["vocab_size"]
        if width > vocab:
            raise ValueError(f"width must be at most the vocabulary size {vocab} (distinct siblings), got {width}")
        kind = proposer_kind(draft)
        if kind not in TREE_PROPOSER_NAMES:  # every kind a tree decoder may declare (tree_heads for the heads)
            raise NotSupportedError(f"the tree decoder drafts trees with {', '.join(TREE_PROPOSER_NAMES)}, not {kind} "
                                    f"(a chain proposer: use decode / decode_batch)")
        if kind == "medusa":
            depth = min(depth, len(draft.lm_heads))
        t = prompt.shape[1]
        result = DecodeResult(tokens=[], prompt_len=t, finished_by="max_new_tokens")
        if max_new_tokens == 0:
            return result
        clock = time.perf_counter if timed else None
        seconds = {"prefill": 0.0, "draft": 0.0, "verify": 0.0, "repair": 0.0}
        tick = clock() if clock else 0.0
        needed = t + max_new_tokens + tree_nodes(depth, width)
        if is_model(draft):
            drafter = DraftModelTrees(self, *open_caches(self.make_cache, self.make_draft_cache, target, draft, prompt,
                                                          needed, result))
        else:
            from .tree_heads import HeadTrees, MedusaTrees

            drafter = (MedusaTrees if kind == "medusa" else HeadTrees).open(self, target, draft, prompt, needed, result)
        target_cache = drafter.target_cache
        limits = [c.max_positions for c in (target_cache, drafter.view) if getattr(c, "max_positions", None)]
        pending = prompt[:, -1:]
        committed = t
        if clock:
            seconds["prefill"] += clock() - tick
        while len(result.tokens) < max_new_tokens:
            start = committed - 1  # slot of the pending token
            room = min(limits) - start if limits else None
            levels, kids = self.shape(depth, width, max_new_tokens - len(result.tokens), room)
            tick = clock() if clock else 0.0
            if levels == 0 or not drafter.ready():  # no room for a tree (or no feature yet): a plain target step
                levels = 0
                final = drafter.plain(pending, sampling, generator)
                result.target_calls += 1
                accepted, path, row, slots = 0, [], [int(final.item())], []
                path_tokens = final[:, None]
                proposed, drafted = 0, ([], [], [])
                if clock:
                    seconds["verify"] += clock() - tick
            else:
                tree = drafter.grow(pending, levels, kids, sampling, generator)
                result.draft_calls += tree.draft_calls
                if clock:
                    now = clock()
                    seconds["draft"] += now - tick
                    tick = now
                m, path_t, tokens = self.verify(target_cache, pending, tree, sampling, generator)
                result.target_calls += 1
                on_path = path_t[0, :levels]
                slots_t = torch.where(on_path >= 0, tree.draft_slots.gather(0, on_path.clamp_min(0)), -1)
                # the one host sync of the round (the tree's nodes and their probabilities too, for the round's record)
                ids = torch.cat([m[:1], on_path, tokens[0, : levels + 1], slots_t, tree.tokens, tree.parents])
                node_q = tree.draft_probs.gather(1, tree.tokens[:, None])[:, 0]
                flat = torch.cat([ids.double(), node_q.double()]).tolist()
                n, ints = tree.size, [int(x) for x in flat[: len(ids)]]
                accepted = ints[0]
                path = ints[1 : 1 + accepted]
                row = ints[1 + levels : 2 + 2 * levels]
                slots = ints[2 + 2 * levels : 2 + 3 * levels]
                drafted = (ints[2 + 3 * levels : 2 + 3 * levels + n], ints[2 + 3 * levels + n :], flat[len(ids) :])
                path_tokens = tokens[:, : levels + 1]
                proposed = tree.size
                if clock:
                    now = clock()
                    seconds["verify"] += now - tick
                    tick = now
            result.host_syncs += 1
            untruncated = [x for x in row if x >= 0][: max_new_tokens - len(result.tokens)]  # accepted path, final token
            emitted, hit_eos = _truncate(untruncated, eos_id)
            kept = self.kept_in_cache(emitted, untruncated)
            result.draft_calls += drafter.repair(start, kept, levels == 0, path[: kept - 1], slots, path_tokens, emitted)
            committed += len(emitted)
            result.tokens.extend(emitted)
            pending = path_tokens[:, len(emitted) - 1 : len(emitted)]
            if clock:
                seconds["repair"] += clock() - tick
            if end_round(result, on_round, target_cache, drafter.view, start=start + 1, proposed=proposed,
                         accepted=accepted, emitted=len(emitted), committed=committed, hit_eos=hit_eos,
                         drafts=drafted[0], parents=drafted[1], draft_probs=drafted[2]):
                break
        if timed:
            result.seconds = seconds
        return result


    def decode_tree_batch(self, target, draft, requests, *, depth: int, width: int,
                          on_round: RoundHook | None = None) -> list[DecodeResult]:
        """Every request as a row of one batch (:func:`specdec_ref.tree_batch.decode_tree_batch`); a seeded request
        gives what :meth:`decode` gives it alone."""
        return decode_tree_batch(self, target, draft, requests, depth=depth, width=width, on_round=on_round)


class DraftModelTrees:
    """The draft model's side of the tree decoder's rounds (the decoder's overridable steps on the draft's cache)."""

    def __init__(self, decoder: TreeSpeculativeDecoder, target_cache: ModelCache, draft_cache: ModelCache):
        self.decoder, self.target_cache, self.view = decoder, target_cache, draft_cache

    def ready(self) -> bool:
        return True

    def plain(self, pending, sampling, generator) -> torch.Tensor:
        """A plain target step (the draft follows the pending token: one draft call, counted by the repair)."""
        return self.decoder.plain_step(self.target_cache, self.view, pending, sampling, generator)

    def grow(self, pending, levels, width, sampling, generator) -> DraftTree:
        return self.decoder.grow(self.view, pending, levels, width, sampling, generator)

    def repair(self, start: int, kept: int, plain: bool, path: list[int], slots: list[int], path_tokens,
               emitted: list[int]) -> int:
        """Both caches hold the committed text but the pending token; returns the draft calls (the plain step's one).
        ``emitted``: the round's committed tokens (host ints; a drafter that reads them needs no device read)."""
        if plain:
            self.target_cache.commit(start + kept)
            self.view.commit(start + kept)
            return 1
        return self.decoder.repair(self.target_cache, self.view, start, path, slots, path_tokens)


def tree_speculative_decode(target, draft, prompt, *, tree_verifier: TreeVerifierBase | None = None, **kwargs) -> DecodeResult:
    """Tree speculative decoding with the reference caches (see :class:`TreeSpeculativeDecoder`)."""
    return TreeSpeculativeDecoder(tree_verifier=tree_verifier).decode(target, draft, prompt, **kwargs)
