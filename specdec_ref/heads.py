"""Proposers that read the target's hidden states: EAGLE, EAGLE-3, MTP, Medusa (and the feature bookkeeping they share).

A *feature* is a target hidden state at one position (``StaticModelCache.capture``: by default :data:`FINAL`, the
last hidden state after the final norm, what the target's lm_head reads). Alignment, in the decoder's terms (a row's
committed text ``c_0 .. c_C-1``; the target cache holds ``c_0 .. c_C-2``; ``c_C-1`` is the *pending* token):

* the feature ``f_j`` of position ``j`` is what the target computed after reading ``c_j`` (the state that produced
  the distribution of ``c_j+1``); a head pairs ``f_j-1`` with the token ``c_j`` (EAGLE's input at position ``j``);
* so a round's first draft reads ``f_C-2`` (the last position the target has read) with the pending ``c_C-1``;
  after the round the target has read the block ``[c_C-1, d_1 .. d_k]``: with ``m`` drafts accepted and one token
  emitted after them, the features of block positions ``0 .. m`` are valid (the accepted prefix) and the rest belong
  to rejected drafts (:meth:`FeatureProposer.round_features` keeps exactly the first ``m + 1``); with all ``k``
  accepted, the bonus token pairs with ``d_k``'s feature (block position ``k``);
* a row whose prompt is one token has no feature yet: its first round is a plain target step (as an engine prefills
  the prompt before its drafter runs).

:class:`EagleHead` (EAGLE-1): ``h = layers(fc([embed(token), feature]))``, ``logits = lm_head(h)`` (the target's
embedding and lm_head unless the head has its own), and ``h`` is the feature the next draft step reads; the head's
decoder layers keep their own KV cache of the committed positions (catch-up: positions committed since the last round
are re-run with the *target's* features, never the head's own). :class:`MedusaHeads`: head ``i`` maps the feature that
produced the pending token through its residual blocks and lm_head to the token ``i + 1`` places after the pending
one; all heads read the same feature (no chaining). Drafts are sampled from the head's processed logits (``q``
reported) when ``sample`` is set, else its argmax (one-hot, as vLLM drafts).

:class:`Eagle3Head` (EAGLE-3): the feature is the concatenation of the residual streams *entering* the target layers
``aux_layers`` (``0`` the embeddings, ``N`` the last layer's output; before any norm; ascending, as vLLM's ids), mapped
to the head's width by ``fuse`` in the catch-up only; then EAGLE's ``fc``, layers and chaining on the head's own
hidden; its lm_head scores a draft vocabulary mapped to target ids by ``d2t`` (``d + d2t[d]``; other ids ``-inf``).
:class:`MtpHead` (DeepSeek-style MTP): EAGLE with RMS norms on both inputs and on the output (the normed output is the
next step's feature), the target's embedding and lm_head, and the token embedding zeroed at position 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from .draws import choose_rows, row_generators
from .history import process_logits
from .proposers import Proposer
from .row_cache import RowCaches
from .row_products import linear
from .static_cache import FINAL

__all__ = ["EagleHead", "Eagle3Head", "MtpHead", "MedusaHeads", "FeatureProposer", "EagleProposer", "Eagle3Proposer",
           "MtpProposer", "MedusaProposer"]


def _target_parts(target):
    """``(embedding [V, H], lm_head weight [V, H])`` of a transformers causal LM."""
    return target.get_input_embeddings().weight.detach(), target.get_output_embeddings().weight.detach()


@dataclass(eq=False)
class EagleHead:
    """An EAGLE(-1) drafter (module docstring). ``fc [H, 2H]`` reads ``[embedding, feature]``; ``layers`` is a
    Llama/Qwen2 causal LM whose decoder layers (only) run on the fc output, or None (no layers); ``embed`` /
    ``lm_head`` ``[V, H]`` default to the target's."""

    fc: torch.Tensor
    fc_bias: torch.Tensor | None = None
    layers: torch.nn.Module | None = None
    embed: torch.Tensor | None = None
    lm_head: torch.Tensor | None = None
    feature_layer: object = FINAL
    sample: bool = True
    name: str = "eagle"
    proposer_kind = "eagle"

    @property
    def target_capture(self) -> tuple:
        """The target hidden states the decoder keeps for this head (the proposer class's reading rule)."""
        return self.proposer_type.capture_for(self)

    def check_target(self, target) -> None:
        embed, head = _target_parts(target)
        hidden = embed.shape[1]
        if tuple(self.fc.shape) != (hidden, 2 * hidden):
            raise ValueError(f"{self.name}: fc must be [H, 2H] = [{hidden}, {2 * hidden}] for this target, got "
                             f"{list(self.fc.shape)}")
        for part, name in ((self.embed, "embed"), (self.lm_head, "lm_head")):
            if part is not None and tuple(part.shape) != tuple(head.shape):
                raise ValueError(f"{self.name}: {name} must be [V, H] = {list(head.shape)}, got {list(part.shape)}")

    def parts(self, target):
        embed, head = _target_parts(target)
        return (self.embed if self.embed is not None else embed), (self.lm_head if self.lm_head is not None else head)

    def open(self, decoder, target, batch, k, tokens, target_cache):
        """The :class:`EagleProposer` over the batch (the head's layers get an empty cache of their own: the catch-up
        writes the prompt's positions with the target's features)."""
        head_cache = None
        if self.layers is not None:
            needed = max(p.shape[1] + n for p, n in zip(batch.prompts, batch.max_new)) + k
            head_cache = RowCaches(decoder.make_draft_cache(self.layers, batch_size=len(tokens), check_ids=False,
                                                            max_length=needed))
        return self.proposer_type(decoder.draft_probs, self, target, list(target_cache.tentative), tokens,
                                  _prefill(target_cache, tokens), head_cache)


@dataclass(eq=False)
class MedusaHeads:
    """Medusa heads (module docstring): ``blocks[i]`` is head ``i``'s residual blocks ``[(W [H, H], b [H]), ...]``
    (``x = x + silu(W x + b)`` each), ``lm_heads[i]`` its ``[V, H]`` output layer. Head ``i`` proposes the draft at
    offset ``i + 1`` after the pending token; a round drafts at most ``len(lm_heads)`` tokens."""

    blocks: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]]
    lm_heads: Sequence[torch.Tensor]
    feature_layer: object = FINAL
    sample: bool = False
    name: str = "medusa"
    proposer_kind = "medusa"

    @property
    def target_capture(self) -> tuple:
        return self.proposer_type.capture_for(self)

    def check_target(self, target) -> None:
        _, head = _target_parts(target)
        if len(self.blocks) != len(self.lm_heads) or not self.lm_heads:
            raise ValueError(f"{self.name}: one list of blocks per lm_head, at least one head")
        for i, w in enumerate(self.lm_heads):
            if tuple(w.shape) != tuple(head.shape):
                raise ValueError(f"{self.name}: lm_heads[{i}] must be [V, H] = {list(head.shape)}, got {list(w.shape)}")

    def open(self, decoder, target, batch, k, tokens, target_cache):
        return self.proposer_type(decoder.draft_probs, self, target, list(target_cache.tentative), tokens, _prefill(target_cache, tokens))


class FeatureProposer(Proposer):
    """The feature bookkeeping of a head (module docstring): per row, the committed tokens and target features the
    head has not read yet (``backlog``: pairs ``(c_j, f_j-1)`` for the positions since its last read)."""

    def __init__(self, draft_probs, spec, target, lengths, tokens, prefill: dict | None):
        super().__init__(draft_probs, lengths)
        self.spec = spec
        self.target_capture = type(self).capture_for(spec)
        self.device = next(target.parameters()).device
        self.dtype = next(target.parameters()).dtype  # features are kept (and heads run) in the target's dtype
        # backlog[b] = (tokens [n], features [n, H]); the prompt's positions 1 .. t-1 with features 0 .. t-2
        self.backlog: list[tuple[list[int], torch.Tensor | None]] = []
        for b, text in enumerate(tokens):
            if len(text) > 1:
                self.backlog.append((list(text[1:]), self.fused(prefill)[b, : len(text) - 1]))
            else:
                self.backlog.append(([], None))
        self.block: torch.Tensor | None = None
        self.block_starts: list[int] = []
        self.emitted: dict[int, list[int]] = {}

    @classmethod
    def capture_for(cls, spec) -> tuple:
        """The target hidden states a head of ``spec`` reads (:data:`FINAL` or layer numbers), in the order they are
        concatenated into its feature."""
        return (spec.feature_layer,)

    def fused(self, features: dict) -> torch.Tensor:
        """``[B, n, H * len(target_capture)]``: the captured states concatenated in :attr:`target_capture` order, in
        the target's dtype."""
        parts = [features[layer] for layer in self.target_capture]
        return (parts[0] if len(parts) == 1 else torch.cat(parts, -1)).to(self.dtype)

    def ready(self) -> bool:
        return any(features is not None for _, features in self.backlog)

    def counts(self, k: int):
        """``counts`` for :meth:`propose`: 0 for the rows with no feature yet (their first round is a plain target
        step, whatever their neighbours do), None when every row drafts ``k``."""
        counts = [k if features is not None else 0 for _, features in self.backlog]
        return None if all(c == k for c in counts) else counts

    def observe(self, features, starts):
        self.block = self.fused(features)
        self.block_starts = list(starts)

    def commit_tokens(self, b, tokens):
        self.emitted[b] = list(tokens)

    def round_features(self, b: int, kept: int, proposed: int) -> torch.Tensor:
        """Row ``b``'s target features for the tokens it committed this round: block positions ``0 .. kept - 1`` (the
        pending token and the accepted drafts; the rejected drafts' features are dropped)."""
        return self.block[b, :kept]

    def repair(self, drafts, new_lens, fed_all):
        proposed = drafts.shape[1]
        for b, new_len in enumerate(new_lens):
            kept = new_len - self.lengths[b]  # tokens the target read and keeps this round
            tokens = self.emitted.get(b, [])
            if kept <= 0 or not tokens:
                continue
            features = self.round_features(b, kept, proposed)
            old_tokens, old_features = self.backlog[b]
            merged = features if old_features is None else torch.cat([old_features, features])
            self.backlog[b] = (old_tokens + tokens[:kept], merged)
        self.emitted = {}
        self.lengths = list(new_lens)
        return 0

    def select(self, rows):
        super().select(rows)
        self.backlog = [self.backlog[i] for i in rows]

    def last_features(self) -> torch.Tensor:
        """``[B, H]``: each row's feature of the last position the target read (the one that produced its pending token;
        zeros for a row with none yet, which proposes nothing)."""
        hidden = next(f for _, f in self.backlog if f is not None).shape[-1]
        zero = torch.zeros(hidden, device=self.device, dtype=self.dtype)
        return torch.stack([features[-1] if features is not None else zero for _, features in self.backlog])

    def warp_draft(self, logits: torch.Tensor, configs, state, drafts: torch.Tensor, generator, counts=None):
        """A draft per row from ``logits [B, V]``: sampled from the processed logits (``q`` returned) when the spec
        samples, else the argmax of the processed logits (``q`` None: one-hot). Rows that propose nothing
        (``counts[b] == 0``) draw nothing from their generators (their output must not depend on the batch)."""
        if self.spec.sample:
            sample_probs, q = self.draft_probs(logits[:, None], configs, state, drafts)
            if counts is None:
                return choose_rows(sample_probs, configs, generator), q
            active = [b for b, c in enumerate(counts) if c > 0]
            token = sample_probs.argmax(-1)
            if active:
                rows = torch.tensor(active, dtype=torch.long, device=token.device)
                gens = row_generators(generator, active) if isinstance(generator, (list, tuple)) else generator
                token[rows] = choose_rows(sample_probs[rows], [configs[b] for b in active], gens)
            return token, q
        processed = process_logits(logits[:, None].float(), configs, state, drafts)[:, -1]
        return processed.argmax(-1), None


class EagleProposer(FeatureProposer):
    """:class:`EagleHead` over the rows: the catch-up of the backlog, then ``k`` autoregressive steps on its features."""

    kind = "eagle"

    def __init__(self, draft_probs, spec: EagleHead, target, lengths, tokens, prefill, head_cache):
        super().__init__(draft_probs, spec, target, lengths, tokens, prefill)
        self.embed, self.lm_head = spec.parts(target)
        self.head_cache = head_cache  # RowCaches over spec.layers (None: no layers)
        self.keep_head = None

    def step(self, ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor | None = None,
             tree: tuple | None = None) -> torch.Tensor:
        """The head on ``ids [B, n]`` with ``features [B, n, H]`` (``positions [B, n]``: the pairs' positions, given
        for the catch-up only; ``tree = (parents, tree_start)``: the pairs are nodes of a draft tree, fed by
        ``feed_tree``): its hidden states ``[B, n, H]``, each the next step's feature."""
        return self.layers(self.combine(F.embedding(ids, self.embed), features, positions), ids, tree)

    def combine(self, embeds: torch.Tensor, features: torch.Tensor, positions) -> torch.Tensor:
        """The decoder layers' input from the token embeddings and the features: ``fc([embed, feature])``."""
        return linear(torch.cat([embeds, features], -1), self.spec.fc, self.spec.fc_bias)

    def layers(self, x: torch.Tensor, ids: torch.Tensor, tree: tuple | None = None) -> torch.Tensor:
        """The head's decoder layers on ``x [B, n, H]`` at the rows' next positions of its cache (none: ``x``); with
        ``tree = (parents, tree_start)`` (one row) as tree nodes with tree attention (``ModelCache.feed_tree``)."""
        if self.head_cache is None:
            return x
        if tree is None:
            return self.head_cache.feed(ids, None, embeds=x, head=False).to(self.dtype)
        parents, tree_start = tree
        return self.head_cache.cache.feed_tree(ids, parents, tree_start=tree_start, embeds=x, head=False).to(self.dtype)

    def first_features(self, features: torch.Tensor) -> torch.Tensor:
        """The catch-up's features from the stored target features (EAGLE: as they are)."""
        return features

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft logits ``[B, V]`` over the target's vocabulary from the head's hidden ``h [B, H]``."""
        return linear(h, self.lm_head)

    def propose(self, pending, k, configs, state, generator):
        # catch-up: every row's backlog (right-padded to the longest), its last real position drafts d_1
        n = [len(tokens) for tokens, _ in self.backlog]
        width = max(n)
        ids = torch.zeros(len(n), width, dtype=torch.long, device=self.device)
        stored = next(f for _, f in self.backlog if f is not None)
        feats = torch.zeros(len(n), width, stored.shape[-1], dtype=stored.dtype, device=self.device)
        for b, (tokens, features) in enumerate(self.backlog):
            if n[b]:
                ids[b, : n[b]] = torch.tensor(tokens, dtype=torch.long)
                feats[b, : n[b]] = features
        # the pair (c_j, f_j-1) sits at position j - 1: a row's backlog ends at its last read position
        positions = (torch.tensor([length - x for length, x in zip(self.lengths, n)], device=self.device)[:, None]
                     + torch.arange(width, device=self.device))
        counts = self.counts(k)
        before = list(self.head_cache.tentative) if self.head_cache is not None else None
        hidden = self.step(ids, self.first_features(feats), positions)
        last = torch.tensor([max(x - 1, 0) for x in n], device=self.device)
        h = hidden[torch.arange(len(n), device=self.device), last]
        if self.head_cache is not None:  # the padding past each row's backlog is dropped: its committed positions stay
            self.head_cache.commit([start + x for start, x in zip(before, n)])
            self.keep_head = list(self.head_cache.tentative)
        self.backlog = [([], None) for _ in n]
        drafts, qs = [], []
        for i in range(k):
            logits = self.logits(h)
            token, q = self.warp_draft(logits, configs, state, torch.stack(drafts, 1) if drafts else pending[:, :0],
                                       generator, counts)
            drafts.append(token)
            qs.append(q)
            if i + 1 < k:
                h = self.step(token[:, None], h[:, None])[:, -1]
        return torch.stack(drafts, 1), (None if qs[0] is None else torch.stack(qs, 1)), counts, k

    def repair(self, drafts, new_lens, fed_all):
        if self.head_cache is not None and self.keep_head is not None:
            self.head_cache.commit(self.keep_head)  # the drafts' positions ran on the head's own features: dropped
        return super().repair(drafts, new_lens, fed_all)

    def select(self, rows):
        super().select(rows)
        if self.head_cache is not None:
            self.head_cache.select(rows)
        if self.keep_head is not None:
            self.keep_head = [self.keep_head[i] for i in rows]

    def row_kv(self, b):
        return [] if self.head_cache is None else self.head_cache.row(b).layer_kv()


class MedusaProposer(FeatureProposer):
    """:class:`MedusaHeads` over the rows: every head reads the feature that produced the pending token."""

    kind = "medusa"

    def head(self, i: int, feature: torch.Tensor) -> torch.Tensor:
        """Head ``i``'s logits ``[B, V]`` from ``feature [B, H]``."""
        x = feature
        for w, bias in self.spec.blocks[i]:
            x = x + F.silu(linear(x, w, bias))
        return linear(x, self.spec.lm_heads[i])

    def propose(self, pending, k, configs, state, generator):
        feature = self.last_features()
        drafts, qs = [], []
        requested, k = k, min(k, len(self.spec.lm_heads))
        counts = self.counts(k) if k == requested else [k if f is not None else 0 for _, f in self.backlog]
        for i in range(k):
            token, q = self.warp_draft(self.head(i, feature), configs, state,
                                       torch.stack(drafts, 1) if drafts else pending[:, :0], generator, counts)
            drafts.append(token)
            qs.append(q)
        # backlog: only the newest feature matters to Medusa; keep the last pair
        self.backlog = [(tokens[-1:], features[-1:] if features is not None else None) for tokens, features in self.backlog]
        return torch.stack(drafts, 1), (None if qs[0] is None else torch.stack(qs, 1)), counts, 0


@dataclass(eq=False)
class Eagle3Head(EagleHead):
    """An EAGLE-3 drafter: :class:`EagleHead` whose feature fuses several target layers and whose lm_head covers a
    draft vocabulary (module docstring of :mod:`specdec_ref.heads`, "EAGLE-3").

    ``aux_layers``: the residual streams entering those target layers (``0`` the token embeddings, ``N`` the last
    layer's output, before any norm), concatenated in ascending order, duplicates once (vLLM's
    ``eagle_aux_hidden_state_layer_ids``); ``fuse [H, n H]`` maps them to the head's width in the catch-up only (later
    draft steps read the head's own hidden). ``lm_head [Vd, H]`` scores the draft vocabulary and ``d2t [Vd]`` maps draft
    id ``d`` to target id ``d + d2t[d]``; every other target id has logit ``-inf`` (None: ``Vd`` = V, no map)."""

    fuse: torch.Tensor | None = None
    aux_layers: tuple = ()
    d2t: torch.Tensor | None = None
    name: str = "eagle3"
    proposer_kind = "eagle3"

    def check_target(self, target) -> None:
        embed, _ = _target_parts(target)
        vocab, hidden = embed.shape
        layers = target.config.num_hidden_layers
        aux = sorted(set(self.aux_layers))
        if not aux or any(isinstance(a, bool) or not isinstance(a, int) or not 0 <= a <= layers for a in aux):
            raise ValueError(f"{self.name}: aux_layers must be layer ids in [0, {layers}] (the residual stream entering "
                             f"that layer; {layers}: the last layer's output), got {self.aux_layers!r}")
        if self.fuse is None or tuple(self.fuse.shape) != (hidden, len(aux) * hidden):
            raise ValueError(f"{self.name}: fuse must be [H, n H] = [{hidden}, {len(aux) * hidden}] for {len(aux)} aux "
                             f"layers, got {None if self.fuse is None else list(self.fuse.shape)}")
        if tuple(self.fc.shape) != (hidden, 2 * hidden):
            raise ValueError(f"{self.name}: fc must be [H, 2H] = [{hidden}, {2 * hidden}], got {list(self.fc.shape)}")
        if self.d2t is None:
            return super().check_target(target)
        ids = torch.arange(len(self.d2t)) + self.d2t.cpu()
        if self.lm_head is None or tuple(self.lm_head.shape) != (len(self.d2t), hidden):
            raise ValueError(f"{self.name}: with d2t of {len(self.d2t)} entries the lm_head must be "
                             f"[{len(self.d2t)}, {hidden}]")
        if self.d2t.dtype != torch.long or ids.min() < 0 or ids.max() >= vocab or len(set(ids.tolist())) != len(ids):
            raise ValueError(f"{self.name}: d2t must map the draft ids to distinct target ids in [0, {vocab}) "
                             f"(target = draft + d2t[draft]), got {self.d2t.tolist()}")


@dataclass(eq=False)
class MtpHead(EagleHead):
    """A multi-token-prediction module chained on the target's final hidden state (DeepSeek-V3's layout, what vLLM
    runs as ``method="mtp"``): ``u = fc([enorm(embed(token)), hnorm(feature)])``, ``out = norm(layers(u))``, logits
    ``lm_head(out)`` and ``out`` the next step's feature; the embedding and lm_head are always the target's, the
    token embedding is zeroed at position 0 (``mask_position0``: the pair of the prompt's second token with the first
    token's feature, as DeepSeek, MiMo and Ernie MTP do); every draft step reuses the same module. Norm weights default
    to ones; ``eps`` is the norms' epsilon."""

    enorm: torch.Tensor | None = None
    hnorm: torch.Tensor | None = None
    norm: torch.Tensor | None = None
    eps: float = 0.0
    mask_position0: bool = True
    name: str = "mtp"
    proposer_kind = "mtp"

    def check_target(self, target) -> None:
        if self.embed is not None or self.lm_head is not None:
            raise ValueError(f"{self.name}: an MTP module uses the target's embedding and lm_head (embed and lm_head "
                             f"must be None)")
        super().check_target(target)
        hidden = _target_parts(target)[0].shape[1]
        for part, name in ((self.enorm, "enorm"), (self.hnorm, "hnorm"), (self.norm, "norm")):
            if part is not None and tuple(part.shape) != (hidden,):
                raise ValueError(f"{self.name}: {name} must be [H] = [{hidden}], got {list(part.shape)}")


class Eagle3Proposer(EagleProposer):
    """:class:`Eagle3Head` over the rows: the fused feature in the catch-up, draft ids mapped to target ids."""

    kind = "eagle3"

    @classmethod
    def capture_for(cls, spec) -> tuple:
        return tuple(sorted(set(spec.aux_layers)))

    def __init__(self, draft_probs, spec, target, lengths, tokens, prefill, head_cache):
        super().__init__(draft_probs, spec, target, lengths, tokens, prefill, head_cache)
        self.vocab = _target_parts(target)[0].shape[0]
        self.targets = None if spec.d2t is None else self.draft_to_target(spec.d2t.to(self.device))

    def draft_to_target(self, d2t: torch.Tensor) -> torch.Tensor:
        """Target id of every draft id: ``d + d2t[d]``."""
        return torch.arange(len(d2t), device=d2t.device) + d2t

    def first_features(self, features):
        return linear(features, self.spec.fuse)

    def logits(self, h):
        draft = linear(h, self.lm_head)
        if self.targets is None:
            return draft
        full = draft.new_full((draft.shape[0], self.vocab), float("-inf"))
        full[:, self.targets] = draft
        return full


class MtpProposer(EagleProposer):
    """:class:`MtpHead` over the rows: normed inputs, the masked position 0, the normed output recycled."""

    kind = "mtp"

    def _rms(self, x: torch.Tensor, weight) -> torch.Tensor:
        """RMSNorm as Llama's (in float32, then the input dtype); a zero vector stays zero at eps 0 (the catch-up's
        padding has zero features: a NaN there would reach the head's cache, where a masked slot's value still
        multiplies its zero attention weight)."""
        y = x.float()
        ms = y.pow(2).mean(-1, keepdim=True) + self.spec.eps
        y = y * torch.where(ms > 0, torch.rsqrt(ms), torch.zeros_like(ms))
        y = y.to(x.dtype)
        return y if weight is None else weight * y

    def combine(self, embeds, features, positions):
        e = self._rms(embeds, self.spec.enorm)
        if self.spec.mask_position0 and positions is not None:
            e = e * (positions != 0).unsqueeze(-1).to(e.dtype)  # after the norm: the same as before it, for eps > 0
        return super().combine(e, self._rms(features, self.spec.hnorm), positions)

    def step(self, ids, features, positions=None, tree=None):
        return self._rms(super().step(ids, features, positions, tree), self.spec.norm)


# the proposer class a spec opens (a mutant's copy of a spec names its buggy subclass instead)
EagleHead.proposer_type = EagleProposer
Eagle3Head.proposer_type = Eagle3Proposer
MtpHead.proposer_type = MtpProposer
MedusaHeads.proposer_type = MedusaProposer


def _prefill(target_cache, tokens) -> dict:
    """The target's hidden states of the prompts' prefill (none when every prompt is one token)."""
    return target_cache.cache.features() if any(len(t) > 1 for t in tokens) else {}
