"""The backend contract: everything a speculative-decoding backend exposes, declares and must honour.

This module is the one file a backend author reads. A *backend* is any object with

* ``name: str`` and ``version: str`` (recorded in the certificate),
* ``capabilities``: a :class:`Capabilities` declaring what it supports,
* the methods its capabilities claim: ``verify`` for ``verifier`` (:class:`Verifier`),
  ``decode`` for ``decoder`` (:class:`Decoder`), ``make_cache`` for ``cache``
  (:class:`CacheBackend`, returning a :class:`KVCache`).

:func:`check_backend` checks these declarations when the suite loads a backend
(``--specdec-backend=module:factory``): a claimed capability without its method is a
:class:`ContractError` naming the method, not a confusing failure later. Checks that need
a capability the backend does not claim are *skipped*, naming the capability; every claimed
capability must pass every check that needs it. Asked for a mode it does not claim, a
backend must raise :class:`NotSupportedError` (checked by
``unclaimed_modes_raise_not_supported``), never return an uncertified answer.

The verifier contract (FlashInfer's shapes)
-------------------------------------------
::

    verify(draft_tokens: Long[B, k],
           draft_probs: Float[B, k, V] | None,
           target_probs: Float[B, k+1, V],
           *, generator: torch.Generator | None = None)
        -> (num_accepted: Long[B], tokens: Long[B, k+1])

* Row alignment: ``target_probs[:, i]`` is the target distribution for the position of
  ``d_{i+1}`` (it judges ``d_{i+1}``): row 0 is ``saved_next`` (the target's distribution
  before the block), row ``i`` the distribution after seeing ``d_i``; row ``k`` is the
  *bonus* row, used when all ``k`` drafts are accepted.
* ``draft_probs[:, i]`` is exactly the distribution ``d_{i+1}`` was drawn from (after
  temperature / top-k / top-p). What the verifier does with it is its declared *scheme*
  (below); the default, ``token``, accepts ``d`` with probability ``min(1, p(d) / q(d))``
  and stops at the first rejection.
* ``draft_probs is None`` means greedy: accept ``d_i`` while it is the target's greedy choice
  for its row; the replacement (or the bonus) is that choice. The reference uses
  ``torch.argmax`` semantics (first maximal index), so it reproduces plain autoregressive
  greedy decoding exactly. The conformance check accepts any *valid greedy path*: every
  accepted draft and the final emitted token are maximisers of their rows, and acceptance
  never goes past a draft token that is not a maximiser. Exact ties are not held against a
  backend that breaks them differently.
* Output: ``m = num_accepted[b]`` with ``0 <= m <= k``; ``tokens[b, :m]`` are the accepted
  drafts, ``tokens[b, m]`` is the replacement (for ``token``: a sample of the residual
  ``[p - q]_+`` renormalised, at row ``m``) or the bonus (a sample of row ``k``), and
  ``tokens[b, m+1:] == PAD_TOKEN`` (``-1``). Both are int64 tensors. A backend declaring
  ``bonus=False`` emits no bonus: when ``m == k``, ``tokens[b, k] == PAD_TOKEN``.
* Randomness comes only from ``generator`` when one is given (the same generator state gives
  the same output; the global torch RNG is never read). A backend claiming ``row_generators`` also
  accepts a list of ``B`` entries, one per row (:mod:`specdec_ref.rng`): row ``b`` draws only from
  ``generator[b]``, a ``None`` entry is an unseeded row (the global RNG), and a row's output never
  depends on the other rows, its position or (trees) the batch's padded width: a seeded request
  reproduces alone or in any batch (:mod:`specdec_ref.rng`).
* A backend that does not claim ``batched`` is only ever called with ``B == 1`` (the suite
  splits batches into one call per row, threading the generator through them in row order).

Verification schemes
--------------------
``Capabilities.scheme`` names what ``verify`` computes; the suite tests each scheme against
*its own* exact per-block laws (accepted length, replacement at each stop, bonus), computed
independently in float64 by ``properties.exact``, and every lossless scheme against the
target's sequence law over many rounds:

==================  ===========================================================================
``token``           token-wise rejection sampling (Leviathan et al. 2023, Chen et al. 2023):
                    accept ``d`` w.p. ``min(1, p(d)/q(d))``, replacement ``[p - q]_+``.
``one_hot_draft``   the draft treated as one-hot: accept ``d`` w.p. ``p(d)``, replacement ``p``
                    with ``d`` removed. Exact for any draft; accepts ``sum_x p(x) q(x)`` per draft.
``block``           block verification (Sun et al., "Block verification accelerates speculative
                    decoding", ICLR 2025, arXiv 2403.10444): the block is judged jointly; never
                    accepts fewer drafts on average than ``token``.
``lossy``           anything not claimed exact (typical acceptance, thresholds): the suite measures
                    the total variation between its text law and the target's, with a 99%
                    confidence interval, instead of failing it.
==================  ===========================================================================

``bonus`` (default ``True``) says whether a fully accepted block ends with a bonus token from
row ``k``; ``bonus=False`` is the *no-bonus* variant of any scheme (exact too). A backend that
declares one scheme and runs another fails the per-block law checks of the one it declared.

The reference (:func:`specdec_ref.verify.verify_block`) computes in float32 whatever the input
dtype, never synchronises with the host, and by default validates its inputs (wrong shapes,
``k < 1``, vocabulary mismatch, NaN/inf/negative probabilities, rows not summing to 1, ids
outside ``[0, V)`` give a ``ValueError`` naming the argument).

The tree verifier contract
--------------------------
A backend claiming ``tree`` verifies a *tree* of drafts (EAGLE, Medusa, SpecInfer, Sequoia) in
one call, with FlashInfer's shapes extended by a parent array::

    verify_tree(draft_tokens: Long[B, n],
                parents: Long[B, n],
                draft_probs: Float[B, n, V] | None,
                target_probs: Float[B, n+1, V],
                *, generator: torch.Generator | None = None)
        -> (num_accepted: Long[B], path: Long[B, n], tokens: Long[B, n+1])

* Node ``i`` of row ``b`` carries token ``draft_tokens[b, i]`` and hangs under node
  ``parents[b, i]`` (``-1``: under the root, the committed text). Nodes are topologically
  ordered: ``-1 <= parents[b, i] < i``. Siblings are tried in index order.
* Rows with fewer nodes are padded at the end: a padded node has ``draft_tokens[b, i] == -1``
  (its parent, draft and target rows are ignored, not validated); a real node never follows one.
* ``target_probs[b, 0]`` is the target's distribution at the root (``saved_next``), judging the
  root's children; ``target_probs[b, i + 1]`` is the target's distribution after node ``i``'s
  path, judging node ``i``'s children (and the bonus when node ``i`` is a leaf).
* ``draft_probs[b, i]`` is the draft distribution at node ``i``'s *parent*, the one ``i`` and
  its siblings were drawn from (before removing siblings already drawn, for ``recursive``); all
  siblings carry the same row. ``None`` means greedy (or a tree whose scheme ignores it).
* Output: ``m = num_accepted[b]``; ``path[b, :m]`` the accepted nodes, root to node (each the
  child of the previous one, the first a child of the root), ``-1`` after; ``tokens[b, :m]``
  their tokens, ``tokens[b, m]`` the *final* token: the replacement sampled after all children of
  the last accepted node were rejected, or the bonus sampled from its target row when it is a leaf;
  ``-1`` after. A chain (``parents = [-1, 0, 1, ...]``) gives exactly the chain verifier's output.
* Greedy (``draft_probs=None`` for a backend claiming ``greedy``): the longest path whose every
  node's token is its parent row's greedy choice; the final token is the greedy choice of the
  last node's row (EAGLE's tree verification). Exact ties are judged as for chains (any maximiser).
* Randomness only from ``generator`` (or, claiming ``row_generators``, a list of one per row, as for
  ``verify``); a backend not claiming ``batched`` gets ``B == 1``.

``Capabilities.tree_scheme`` names how sampled trees are drafted and judged (each exact scheme
needs its own drafting, which the suite follows when it builds trees):

=================  ==============================================================================
``specinfer``      siblings drawn independently (with replacement) from the parent's draft row;
                   multi-step speculative sampling (SpecInfer, Miao et al. 2024): sibling ``j`` is
                   accepted w.p. ``min(1, r_j(x)/q(x))``, ``r_{j+1} = norm([r_j - q]_+)``, ``r_1 = p``.
``recursive``      siblings drawn *without* replacement from the parent's draft row; recursive
                   rejection sampling (Jeon et al. 2024): as ``specinfer`` with ``q_j`` the draft row
                   with earlier siblings removed and renormalised.
``deterministic``  siblings are any fixed distinct tokens (e.g. the draft's top-k); each is
                   accepted w.p. ``r_j(x)``, ``r_{j+1}`` = ``r_j`` with ``x`` removed, renormalised
                   (sequential one-hot-draft acceptance; SGLang's tree kernel at thresholds 1, 1).
``lossy``          not claimed exact (acceptance thresholds below 1): the suite measures the total
                   variation between its text law and the target's instead of failing it.
=================  ==============================================================================

In every exact scheme, when all children of a node are rejected the final token is a sample of
the last residual ``r``.

The decoder contract
--------------------
::

    decode(target, draft, prompt: Long[1, t], *, k: int, max_new_tokens: int,
           sampling: SamplingConfig, eos_id: int | None = None,
           generator: torch.Generator | None = None, on_round=None) -> DecodeResult

* ``target`` / ``draft`` are transformers causal LMs sharing one vocabulary; ``prompt`` is one
  row (batch 1). :class:`SamplingConfig` (``greedy``, ``temperature``, ``top_k``, ``top_p``;
  :data:`GREEDY` is argmax) is applied identically to target and draft
  (:func:`specdec_ref.warp.warp`), so ``q`` is exactly what the draft sampled from.
* Greedy decoding must equal plain autoregressive greedy decoding of the target; sampled
  decoding must follow the target's sequence law exactly (whatever the draft).
* Bad input (empty prompt, ``k < 1``, ``max_new_tokens < 0``, ``eos_id`` outside the
  vocabulary, prompt ids out of range, target/draft vocabulary mismatch) raises
  ``ValueError`` (or ``TypeError``), never decodes something.
* EOS anywhere in a block ends generation right after it; at most ``max_new_tokens`` tokens
  are emitted. Nothing after an EOS is ever committed or cached.
* The result is a :class:`DecodeResult`: ``tokens`` (generated ids, prompt excluded),
  ``finished_by`` (``"eos"`` | ``"max_new_tokens"``) and one :class:`RoundRecord` per round.
* A backend claiming ``cache`` calls ``on_round(record, target_cache, draft_cache)`` after every
  round, once its caches are repaired; the caches must offer ``layer_kv()`` (see
  :class:`KVCache`). Invariant after every round: ``record.target_len == record.draft_len ==
  record.committed_len - 1`` (both caches hold the committed tokens except the last, *pending*
  one, fed at the start of the next round), and every layer's K/V equals a fresh prefill of
  that prefix. A backend that does not claim ``cache`` may call ``on_round`` or not.

The batched decoder contract
----------------------------
A backend claiming ``batched_decoder`` decodes many requests at once, as engines do::

    decode_batch(target, draft, requests: list[Request], *, k: int, on_round=None) -> list[DecodeResult]

* Each :class:`Request` has its own ``prompt`` (any length >= 1), ``max_new_tokens``,
  :class:`SamplingConfig` (history-dependent settings included, below), ``eos_ids`` (``None``, an id
  or a collection of ids) and randomness: a ``generator``, a ``seed`` (the backend makes the
  generator), or neither (*unseeded*: the global RNG). One :class:`DecodeResult` per request, in
  the requests' order.
* Rows are independent: every row accepts its own number of drafts each round and stops on its
  own (EOS, ``max_new_tokens``); a finished row leaves the batch and is never written again.
* Batch invariance: a seeded request's output is bit-identical (float32) decoded alone, with any
  other requests (seeded or not), in any order; greedy rows equal AR greedy decoding of the request
  alone at every batch size. Unseeded rows follow the law, whatever their neighbours.
* Every result obeys the stop invariants: ``finished_by == "eos"`` iff the last token is one of
  the request's EOS ids, otherwise exactly ``max_new_tokens`` tokens; no EOS before the last token
  nor before ``min_new_tokens``; every round but the last emits ``accepted + 1`` tokens.
* ``on_round(record, target_cache, draft_cache)`` (claiming ``cache``) runs after every round for
  every row still in the batch, with ``record.row`` its request index and that row's caches (the
  batch-1 cache invariant, per row).
* ``decode`` stays the one-request case: a backend claiming both must give the same results.

Proposers (``Capabilities.proposers``)
--------------------------------------
``draft`` need not be a draft model. A decoder claiming ``proposer:NAME`` accepts these specs
(:mod:`specdec_ref.proposers`, :mod:`specdec_ref.heads`; plain data: tensors and numbers) and drafts with them:

==============  ==============================================================================
``draft_model`` a causal LM sharing the target's vocabulary (the default, always claimed)
``ngram``       :class:`specdec_ref.proposers.Ngram` ``(min_n, max_n)``: prompt lookup, vLLM's rule (the tokens
                after the first earlier occurrence of the longest suffix of the text of length in
                ``[min_n, max_n]``; fewer than ``k`` at the text's end, none without a match); one-hot
``eagle``       :class:`specdec_ref.heads.EagleHead`: ``h = layers(fc([embed(token), feature]))``,
                ``logits = lm_head(h)``, ``h`` the next step's feature; the feature of the position
                before each token (the target's last hidden state after its final norm)
``eagle3``      :class:`specdec_ref.heads.Eagle3Head`: EAGLE on the residual streams entering the target
                layers ``aux_layers`` (ascending), fused by ``fuse`` in the catch-up; a draft vocabulary
                (``lm_head [Vd, H]``, target id ``d + d2t[d]``, other ids ``-inf``)
``mtp``         :class:`specdec_ref.heads.MtpHead`: ``out = norm(layers(fc([enorm(embed), hnorm(feature)])))``,
                the target's embedding and lm_head, ``out`` recycled, the embedding zeroed at position 0
``medusa``      :class:`specdec_ref.heads.MedusaHeads`: head ``i`` reads the feature that produced the
                pending token and proposes the token ``i + 1`` places after it
==============  ==============================================================================

Drafts from a spec whose ``sample`` is False are its argmax (one-hot: judged against ``q = one_hot(d)``, exact under
every scheme); otherwise ``q`` is exactly what they were drawn from (processed like a draft model's). The output
law and greedy equality are the decoder contract's, whatever the proposer; what a proposer's bugs change is
*acceptance*: a feature from the wrong position, features not rolled back to the accepted prefix, a head read at the
wrong offset, a lookup on the wrong text. The suite checks acceptance against the exact expectation on exactly-known
heads (:mod:`specdec_ref.exact_heads`). A row whose prompt is one token has no feature before the target's first
forward: its first round proposes nothing (a plain target step), so its draws never depend on its batch.

With ``cache`` claimed, ``on_round``'s ``draft_cache`` for a head with decoder layers (EAGLE, EAGLE-3, MTP) shows
their K/V (``layer_kv``): every position it holds is a fresh read of a committed pair (token ``c_p+1`` with the
target's feature ``f_p``), and it holds at least the pairs up to the round's pending token and none past the
committed text (the reference reads a round's pairs in the next round's catch-up; an engine may read them at once).

A tree decoder claiming ``tree_proposer:medusa`` (``Capabilities.tree_proposers``) takes :class:`MedusaHeads` as
``decode_tree``'s ``draft``: level ``l``'s children come from head ``l - 1``'s row (the same row for every node of the
level), by the declared tree scheme, and the next round's feature is the target's at the last *accepted* node
(:mod:`specdec_ref.tree_heads`). Claiming ``tree_proposer:eagle`` (``eagle3``, ``mtp``) it takes that head and grows
EAGLE-2's dynamic trees: a node's children come from the head's row after reading the node (paired with the hidden
state that produced the node's own row), expanded nodes of a level in one tree-attention step of the head, and the
next round's catch-up reads the committed tokens with the target's features of the pending token and the accepted
path.

Phase timings (``phase_timings``, optional)
--------------------------------------------
A decoder may report where each round's time went, so that a profile (``specdec-bench profile``) can
put the backend's own figures beside the ones it measures: every :class:`RoundRecord` (those passed to
``on_round`` and those in ``DecodeResult.rounds``) carries ``seconds``, a dict of wall seconds with the
keys of :data:`PHASES`: ``draft`` (proposing the round's drafts), ``verify`` (the target's block
forward, processing its rows and judging them, up to the host sync), ``repair`` (committing the tokens,
rolling both caches back, the draft's catch-up feed), ``other`` (everything else in the round: per-row
bookkeeping, ``on_round``, finished rows leaving); the first round's dict also has ``prefill``. The dict is
complete when ``decode`` / ``decode_batch`` returns (``other`` ends after ``on_round``). In a batch every
row's record of one round holds the *same* dict (the batch round's). The phases of a call add up to its
wall time less argument validation; a profile checks that within a stated tolerance. ``seconds = None``
means not reported; claiming ``phase_timings`` says every record carries them.

Drafts in the round records (``round_drafts``, optional)
--------------------------------------------------------
A decoder claiming ``round_drafts`` says what every round drafted, so that the suite can compare it with the
proposer's exact rule (the proposer and tree-proposer checks; acceptance counts alone miss drafts that change
without changing a count). Every :class:`RoundRecord` of ``decode`` / ``decode_batch`` / ``decode_tree`` /
``decode_tree_batch`` then carries ``drafts``: chain rounds the ``proposed`` draft tokens in order (``[]`` for a
round without drafts, never a padding token past the rule's count); tree rounds every node's token in the order the
tree verifier got them, with ``parents`` (each node's parent index, ``-1`` for the root's children, the tree
verifier's ``parents``) and, where the drafter reports them, ``draft_probs``: each node's probability in the row it
was drawn from (its ``q``; greedy trees: the row its level's expansions are ranked by), or None. A backend that does
not claim ``round_drafts`` may leave the three fields None: its drafts are judged by their counts and acceptance
only (the checks note it). Claimed, a record without its drafts (or with a length other than ``proposed``) fails the
check that reads it; drafts that differ from the rule fail naming the round and node.

History-dependent sampling (``history_sampling``): ``repetition_penalty``, ``presence_penalty``,
``frequency_penalty``, ``logit_bias``, ``min_new_tokens`` (EOS masked before) and ``constraint``
(a :class:`specdec_ref.history.TokenAutomaton`: allowed next tokens as a function of the
generated history, a stand-in for grammars) act on the logits **at every position of a block on
that position's hypothetical history**: the prompt, the committed tokens and the drafts before it;
identically for the draft's proposals and the target's rows; rejected drafts never enter the
history. The order is part of the contract (:func:`specdec_ref.history.process_logits`): logit
bias, repetition penalty (on tokens seen in the prompt or output), presence / frequency penalties
(output tokens), the ``min_new_tokens`` EOS mask, the constraint, then temperature, top-k, top-p
and ``min_p`` (claimed separately as ``min_p``). The suite tests each row's continuation law against
an independent float64 oracle of AR sampling under these settings.

The KV-cache contract
---------------------
``make_cache(model)`` returns a fresh, empty cache for ``model`` (batch 1) with the
:class:`KVCache` interface, modelled on :class:`specdec_ref.cache.ModelCache`:

* ``feed(ids: Long[B, n]) -> Float[B, n, V]``: run ``n >= 1`` tokens on top of the cache, writing
  positions ``tentative_length .. tentative_length + n - 1`` (position ids included); row ``i``
  of the logits is the next-token distribution after ``ids[:, i]``. Advances
  ``tentative_length`` by ``n``.
* ``trim(n)``: keep the first ``n`` positions, ``0 <= n <= tentative_length`` (``trim(0)``
  empties it; trimming below ``committed_length`` lowers it to ``n``).
* ``commit(n)``: trim to ``n`` and mark ``[0, n)`` committed
  (``committed_length <= n <= tentative_length``).
* ``reset()``: drop everything; both lengths become 0.
* ``layer_kv() -> list[(K, V)]``: per layer, keys and values of shape
  ``(B, kv_heads, tentative_length, head_dim)`` (read-only).
* ``committed_length`` / ``tentative_length``: ints, ``0 <= committed <= tentative``.

The ``cache`` check (``properties.stateful_cache``) drives exactly these members with
random feed / trim / commit / reset / logit-probe programs and, after every step, compares the
lengths, every layer's K and V and the logits with a fresh prefill of the kept tokens
(``atol=1e-5, rtol=1e-4`` in float32).

Capability flags
----------------
Every flag defaults to ``False``: a backend claims what it implements, nothing else.

==================  =====================================================================
``verifier``        exposes :meth:`Verifier.verify`
``greedy``          greedy verification (``draft_probs=None``) / greedy decoding
``sampling``        rejection-sampling verification / sampled decoding
``batched``         ``verify`` / ``verify_tree`` accept ``B > 1`` in one call (otherwise they get ``B == 1``)
``cache``           exposes :meth:`CacheBackend.make_cache`; a decoder also calls ``on_round``
``decoder``         exposes :meth:`Decoder.decode`, a full speculative decoder
``top_k``           the decoder honours ``SamplingConfig.top_k``
``top_p``           the decoder honours ``SamplingConfig.top_p``
``tree``            exposes :meth:`TreeVerifier.verify_tree` (its scheme: ``tree_scheme``)
``row_generators``  ``verify`` / ``verify_tree`` accept one generator per row (a list; ``None`` = unseeded)
``tree_decoder``    exposes ``decode_tree``, a speculative decoder that drafts trees
``batched_decoder`` exposes ``decode_batch`` (:class:`BatchedDecoder`): many requests per call
``min_p``           the decoder honours ``SamplingConfig.min_p``
``history_sampling`` the decoder honours penalties, ``logit_bias``, ``min_new_tokens`` and ``constraint``
``phase_timings``   ``decode`` / ``decode_batch`` report each round's phase seconds in ``RoundRecord.seconds`` (below)
``round_drafts``    every ``RoundRecord`` carries the round's ``drafts`` (trees: ``parents``, ``draft_probs``; above)
``batched_tree_decoder`` exposes ``decode_tree_batch(target, draft, requests, *, depth, width, on_round=None)``: the
                    tree decoder's rows, as ``decode_batch`` is the chain decoder's (the proposers in
                    ``batched_tree_proposers``; a seeded request gives what ``decode_tree`` gives it alone)
==================  =====================================================================

``scheme`` (one of :data:`SCHEMES`, default ``"token"``) and ``bonus`` (default ``True``) declare
the verification scheme (above). ``dtypes`` (names from :data:`DTYPE_NAMES`, default ``("float32",)``) and ``devices`` (from
:data:`DEVICE_NAMES`, default ``("cpu",)``) list the dtypes and devices the backend supports;
checks require them as ``dtype:NAME`` / ``device:NAME``. ``proposers`` (from :data:`PROPOSER_NAMES`,
default ``("draft_model",)``) lists what a decoder accepts as its ``draft`` (below); checks require
them as ``proposer:NAME``; ``tree_proposers`` (from :data:`TREE_PROPOSER_NAMES`, default ``("draft_model",)``) what
a tree decoder accepts, required as ``tree_proposer:NAME``; ``batched_tree_proposers`` (among those, default
``("draft_model",)``) what ``decode_tree_batch`` accepts. ``extra`` is free-form notes for the
certificate. Unclaimed modes must raise :class:`NotSupportedError`; checks needing an
unclaimed capability are skipped with the reason (``backend does not claim [...]``).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Protocol, runtime_checkable

import torch

from .capabilities import (  # re-exported: a backend's declaration
    CAPABILITY_FLAGS,
    DEVICE_NAMES,
    DTYPE_NAMES,
    LOSSLESS_SCHEMES,
    LOSSLESS_TREE_SCHEMES,
    PROPOSER_NAMES,
    SCHEMES,
    TREE_PROPOSER_NAMES,
    TREE_SCHEMES,
    Capabilities,
    check_requirement,
)
from .records import DecodeResult, Request, RoundRecord  # re-exported: what a decoder returns and receives
from .warp import GREEDY, SamplingConfig  # re-exported: the sampling settings a decoder receives

__all__ = [
    "PAD_TOKEN",
    "CAPABILITY_FLAGS",
    "SCHEMES",
    "LOSSLESS_SCHEMES",
    "TREE_SCHEMES",
    "LOSSLESS_TREE_SCHEMES",
    "DTYPE_NAMES",
    "DEVICE_NAMES",
    "PROPOSER_NAMES",
    "TREE_PROPOSER_NAMES",
    "check_requirement",
    "NotSupportedError",
    "Capabilities",
    "Backend",
    "Verifier",
    "Decoder",
    "BatchedDecoder",
    "Request",
    "TreeVerifier",
    "KVCache",
    "CacheBackend",
    "RoundHook",
    "RoundRecord",
    "DecodeResult",
    "SamplingConfig",
    "GREEDY",
    "PHASES",
    "ContractError",
    "check_backend",
]

#: Fills ``tokens[b, m+1:]`` in a verifier's output.
PAD_TOKEN = -1

#: The phases of a round a decoder claiming ``phase_timings`` reports in ``RoundRecord.seconds`` (the first round adds
#: ``"prefill"``; see the module docstring).
PHASES = ("draft", "verify", "repair", "other")

class NotSupportedError(NotImplementedError):
    """Raised by a backend asked for something it does not claim to support."""


# ----------------------------------------------------------------------------- protocols


@runtime_checkable
class KVCache(Protocol):
    """What ``make_cache(model)`` returns (the KV-cache contract in the module docstring)."""

    @property
    def committed_length(self) -> int: ...

    @property
    def tentative_length(self) -> int: ...

    def feed(self, ids: torch.Tensor) -> torch.Tensor: ...

    def trim(self, n: int) -> None: ...

    def commit(self, n: int) -> None: ...

    def reset(self) -> None: ...

    def layer_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]: ...


#: ``on_round(record, target_cache, draft_cache)``, called after every round by decoders claiming ``cache``.
RoundHook = Callable[[RoundRecord, KVCache, KVCache], None]


@runtime_checkable
class Backend(Protocol):
    """The declarations every backend makes."""

    name: str
    version: str
    capabilities: Capabilities


@runtime_checkable
class Verifier(Backend, Protocol):
    """A backend claiming ``verifier`` (the verifier contract in the module docstring)."""

    def verify(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class TreeVerifier(Backend, Protocol):
    """A backend claiming ``tree`` (the tree verifier contract in the module docstring)."""

    def verify_tree(
        self,
        draft_tokens: torch.Tensor,
        parents: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class Decoder(Backend, Protocol):
    """A backend claiming ``decoder`` (the decoder contract in the module docstring)."""

    def decode(
        self,
        target: Any,
        draft: Any,
        prompt: torch.Tensor,
        *,
        k: int,
        max_new_tokens: int,
        sampling: SamplingConfig,
        eos_id: int | None = None,
        generator: torch.Generator | None = None,
        on_round: RoundHook | None = None,
    ) -> DecodeResult: ...


@runtime_checkable
class BatchedDecoder(Backend, Protocol):
    """A backend claiming ``batched_decoder`` (the batched decoder contract in the module docstring)."""

    def decode_batch(self, target: Any, draft: Any, requests: list[Request], *, k: int,
                     on_round: RoundHook | None = None) -> list[DecodeResult]: ...


@runtime_checkable
class CacheBackend(Backend, Protocol):
    """A backend claiming ``cache``: ``make_cache(model)`` returns a fresh, empty :class:`KVCache`."""

    def make_cache(self, model: Any) -> KVCache: ...


# ----------------------------------------------------------------------------- declaration check


class ContractError(TypeError):
    """A backend's declarations contradict what it exposes (raised by :func:`check_backend`)."""


#: capability -> (method, how it is called: positional args, keyword args, signature shown in errors)
_CAPABILITY_METHODS: dict[str, tuple[str, tuple, dict, str]] = {
    "verifier": (
        "verify",
        (None, None, None),
        {"generator": None},
        "verify(draft_tokens, draft_probs, target_probs, *, generator=None)",
    ),
    "decoder": (
        "decode",
        (None, None, None),
        dict(k=1, max_new_tokens=1, sampling=None, eos_id=None, generator=None, on_round=None),
        "decode(target, draft, prompt, *, k, max_new_tokens, sampling, eos_id=None, generator=None, on_round=None)",
    ),
    "cache": ("make_cache", (None,), {}, "make_cache(model)"),
    "tree": (
        "verify_tree",
        (None, None, None, None),
        {"generator": None},
        "verify_tree(draft_tokens, parents, draft_probs, target_probs, *, generator=None)",
    ),
    "batched_decoder": (
        "decode_batch",
        (None, None, None),
        dict(k=1, on_round=None),
        "decode_batch(target, draft, requests, *, k, on_round=None)",
    ),
    "batched_tree_decoder": (
        "decode_tree_batch",
        (None, None, None),
        dict(depth=1, width=1, on_round=None),
        "decode_tree_batch(target, draft, requests, *, depth, width, on_round=None)",
    ),
    "tree_decoder": (
        "decode_tree",
        (None, None, None),
        dict(depth=1, width=1, max_new_tokens=1, sampling=None, eos_id=None, generator=None, on_round=None),
        "decode_tree(target, draft, prompt, *, depth, width, max_new_tokens, sampling, eos_id=None, generator=None, on_round=None)",
    ),
}


def check_backend(backend: Any) -> None:
    """Raise :class:`ContractError` when ``backend``'s declarations contradict what it exposes.

    Checked: ``capabilities`` is a :class:`Capabilities`, ``name`` is a non-empty string, and
    each claimed ``verifier`` / ``decoder`` / ``cache`` / ``tree`` / ``tree_decoder`` has a callable
    ``verify`` / ``decode`` / ``make_cache`` / ``verify_tree`` / ``decode_tree`` whose signature
    accepts the contract's call. Behaviour is the checks' job.
    """
    caps = getattr(backend, "capabilities", None)
    if not isinstance(caps, Capabilities):
        raise ContractError(
            f"backend {backend!r}: 'capabilities' must be a specdec_ref.contract.Capabilities, "
            f"got {type(caps).__name__}"
        )
    name = getattr(backend, "name", None)
    if not isinstance(name, str) or not name:
        raise ContractError(f"backend {backend!r} has no 'name' (a non-empty str), got {name!r}")
    for flag, (method, args, kwargs, shown) in _CAPABILITY_METHODS.items():
        if not caps.has(flag):
            continue
        func = getattr(backend, method, None)
        if not callable(func):
            raise ContractError(f"backend {name!r} claims {flag!r} but has no callable {shown}")
        try:
            signature = inspect.signature(func)
        except (TypeError, ValueError):  # builtins and C extensions: nothing to check
            continue
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise ContractError(
                f"backend {name!r} claims {flag!r} but {method}{signature} cannot be called as {shown}: {exc}"
            ) from None
