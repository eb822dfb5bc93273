"""The backend contract: what a speculative-decoding backend exposes, declares and must honour.

A *backend* is any object with ``name: str`` and ``version: str`` (recorded in the certificate), ``capabilities``
(a :class:`Capabilities`; the flags: :class:`Backend`) and the methods its capabilities claim: ``verify`` for
``verifier`` (:class:`Verifier`), ``verify_tree`` for ``tree`` (:class:`TreeVerifier`), ``decode`` for ``decoder``
(:class:`Decoder`), ``decode_batch`` for ``batched_decoder`` (:class:`BatchedDecoder`), ``make_cache`` for ``cache``
(:class:`CacheBackend`, returning a :class:`KVCache`), ``decode_tree`` / ``decode_tree_batch`` for ``tree_decoder`` /
``batched_tree_decoder``. Each protocol's docstring (and its methods') states the rules it must follow.

:func:`check_backend` checks these declarations when the suite loads a backend (``--specdec-backend=module:factory``):
a claimed capability without its method is a :class:`ContractError` naming the method, not a confusing failure later.
Checks that need a capability the backend does not claim are *skipped*, naming the capability; every claimed
capability must pass every check that needs it. Asked for a mode it does not claim, a backend must raise
:class:`NotSupportedError` (checked by ``unclaimed_modes_raise_not_supported``), never return an uncertified answer.

The contracts in prose (why, examples, the papers): docs/contracts.md.
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
#: ``"prefill"``; :class:`Decoder`, "Phase timings").
PHASES = ("draft", "verify", "repair", "other")

class NotSupportedError(NotImplementedError):
    """Raised by a backend asked for something it does not claim to support."""


# ----------------------------------------------------------------------------- protocols


@runtime_checkable
class KVCache(Protocol):
    """What ``make_cache(model)`` returns: one model's KV cache (modelled on :class:`specdec_ref.cache.ModelCache`).

    Invariant: ``0 <= committed_length <= tentative_length``. The ``cache`` check (``specdec_properties.stateful_cache``)
    drives exactly these members with random feed / trim / commit / reset / logit-probe programs and, after every
    step, compares the lengths, every layer's K and V and the logits with a fresh prefill of the kept tokens
    (``atol=1e-5, rtol=1e-4`` in float32).
    """

    @property
    def committed_length(self) -> int:
        """An int: positions ``[0, committed_length)`` are committed."""

    @property
    def tentative_length(self) -> int:
        """An int: the positions held, committed or not (``>= committed_length``)."""

    def feed(self, ids: torch.Tensor) -> torch.Tensor:
        """Run ``ids: Long[B, n]`` (``n >= 1``) on top of the cache; return the logits ``Float[B, n, V]``.

        Writes positions ``tentative_length .. tentative_length + n - 1`` (position ids included); row ``i`` of the
        logits is the next-token distribution after ``ids[:, i]``. Advances ``tentative_length`` by ``n``.
        """

    def trim(self, n: int) -> None:
        """Keep the first ``n`` positions, ``0 <= n <= tentative_length`` (``trim(0)`` empties the cache; trimming
        below ``committed_length`` lowers it to ``n``)."""

    def commit(self, n: int) -> None:
        """Trim to ``n`` and mark ``[0, n)`` committed (``committed_length <= n <= tentative_length``)."""

    def reset(self) -> None:
        """Drop everything: both lengths become 0."""

    def layer_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, ``(K, V)`` of shape ``(B, kv_heads, tentative_length, head_dim)`` (read-only)."""


#: ``on_round(record, target_cache, draft_cache)``, called after every round by decoders claiming ``cache``.
RoundHook = Callable[[RoundRecord, KVCache, KVCache], None]


@runtime_checkable
class Backend(Protocol):
    """The declarations every backend makes: ``name`` (a non-empty str), ``version``, ``capabilities``.

    ``capabilities`` (:class:`Capabilities`): every flag defaults to ``False``; a backend claims what it implements,
    nothing else. Unclaimed modes must raise :class:`NotSupportedError`; checks needing an unclaimed capability are
    skipped with the reason (``backend does not claim [...]``).

    ========================  =================================================================================
    ``verifier``              exposes :meth:`Verifier.verify`
    ``greedy``                greedy verification (``draft_probs=None``) / greedy decoding
    ``sampling``              rejection-sampling verification / sampled decoding
    ``batched``               ``verify`` / ``verify_tree`` accept ``B > 1`` in one call (otherwise they get ``B == 1``)
    ``cache``                 exposes :meth:`CacheBackend.make_cache`; a decoder also calls ``on_round``
    ``decoder``               exposes :meth:`Decoder.decode`, a full speculative decoder
    ``top_k``                 the decoder honours ``SamplingConfig.top_k``
    ``top_p``                 the decoder honours ``SamplingConfig.top_p``
    ``tree``                  exposes :meth:`TreeVerifier.verify_tree` (its scheme: ``tree_scheme``)
    ``row_generators``        ``verify`` / ``verify_tree`` accept one generator per row (a list; ``None`` = unseeded)
    ``tree_decoder``          exposes ``decode_tree(target, draft, prompt, *, depth, width, max_new_tokens, sampling,
                              eos_id=None, generator=None, on_round=None)``, a speculative decoder that drafts trees
    ``batched_decoder``       exposes :meth:`BatchedDecoder.decode_batch`: many requests per call
    ``min_p``                 the decoder honours ``SamplingConfig.min_p``
    ``history_sampling``      the decoder honours penalties, ``logit_bias``, ``min_new_tokens`` and ``constraint``
    ``phase_timings``         ``decode`` / ``decode_batch`` report each round's phase seconds (:class:`Decoder`)
    ``round_drafts``          every ``RoundRecord`` carries the round's ``drafts`` (trees: ``parents``,
                              ``draft_probs``; :class:`Decoder`)
    ``batched_tree_decoder``  exposes ``decode_tree_batch(target, draft, requests, *, depth, width, on_round=None)``:
                              the tree decoder's rows, as ``decode_batch`` is the chain decoder's (proposers:
                              ``batched_tree_proposers``); a seeded request gives what ``decode_tree`` gives it alone
    ========================  =================================================================================

    Besides the flags: ``scheme`` (one of :data:`SCHEMES`, default ``"token"``) and ``bonus`` (default ``True``)
    declare the verification scheme (:class:`Verifier`); ``tree_scheme`` (one of :data:`TREE_SCHEMES`, default
    ``"specinfer"``) the tree scheme (:class:`TreeVerifier`). ``dtypes`` (from :data:`DTYPE_NAMES`, default
    ``("float32",)``) and ``devices`` (from :data:`DEVICE_NAMES`, default ``("cpu",)``): checks require them as
    ``dtype:NAME`` / ``device:NAME``. ``proposers`` (from :data:`PROPOSER_NAMES`, default ``("draft_model",)``): what
    a decoder accepts as its ``draft``, required as ``proposer:NAME``; ``tree_proposers`` (from
    :data:`TREE_PROPOSER_NAMES`, default ``("draft_model",)``): what a tree decoder accepts, required as
    ``tree_proposer:NAME``; ``batched_tree_proposers`` (among those, default ``("draft_model",)``): what
    ``decode_tree_batch`` accepts (:class:`Decoder`, "Proposers"). ``extra``: free-form notes for the certificate.
    """

    name: str
    version: str
    capabilities: Capabilities


@runtime_checkable
class Verifier(Backend, Protocol):
    """A backend claiming ``verifier``: verifies a chain of ``k`` drafts per row (FlashInfer's shapes).

    ``Capabilities.scheme`` names what ``verify`` computes (``p`` the target's row, ``q`` the draft's):

    * ``token``: accept ``d`` w.p. ``min(1, p(d)/q(d))``, stop at the first rejection; replacement ``norm([p - q]_+)``.
    * ``one_hot_draft``: ``d`` as one-hot, exact for any draft: accept w.p. ``p(d)``; replacement ``p`` without ``d``,
      renormalised.
    * ``block``: block verification, the block judged jointly; never fewer accepted drafts on average than ``token``.
    * ``lossy``: anything not claimed exact (typical acceptance, thresholds): measured, not failed.

    ``bonus=False`` is the no-bonus variant of any scheme (exact too): a fully accepted block ends without a bonus.
    Each scheme is checked against *its own* exact per-block laws (accepted length, replacement at each stop, bonus;
    float64, ``specdec_properties.exact``), every lossless one also against the target's sequence law over many rounds; a
    ``lossy`` one gets the total variation between its text law and the target's, with a 99% confidence interval.
    A backend that declares one scheme and runs another fails the per-block law checks of the one it declared.

    Not claiming ``batched``: ``verify`` is only ever called with ``B == 1`` (the suite splits a batch into one call
    per row, threading the generator through them in row order).

    The reference (:func:`specdec_ref.verify.verify_block`) computes in float32 whatever the input dtype, never
    synchronises with the host, and by default validates its inputs: wrong shapes, ``k < 1``, vocabulary mismatch,
    NaN/inf/negative probabilities, rows not summing to 1, ids outside ``[0, V)`` give a ``ValueError`` naming the
    argument.
    """

    def verify(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(draft_tokens Long[B, k], draft_probs Float[B, k, V] | None, target_probs Float[B, k+1, V])`` ->
        ``(num_accepted Long[B], tokens Long[B, k+1])``, both int64.

        * Rows: ``target_probs[:, i]`` judges ``d_{i+1}``: row 0 is ``saved_next`` (the target's distribution before
          the block), row ``i`` the distribution after ``d_i``, row ``k`` the *bonus* row (all ``k`` accepted).
        * ``draft_probs[:, i]`` is exactly the distribution ``d_{i+1}`` was drawn from (after temperature / top-k /
          top-p); what ``verify`` does with it is the declared scheme.
        * ``draft_probs is None`` means greedy: accept ``d_i`` while it is its row's greedy choice; the replacement
          (or the bonus) is that choice. The reference uses ``torch.argmax`` (first maximal index), which reproduces
          AR greedy decoding exactly; the check accepts any valid greedy path: every accepted draft and the emitted
          token maximise their rows, and acceptance never passes a draft that does not. Exact ties broken
          differently are not held against a backend.
        * Output: ``m = num_accepted[b]``, ``0 <= m <= k``; ``tokens[b, :m]`` are the accepted drafts,
          ``tokens[b, m]`` the replacement (``token``: a sample of ``norm([p - q]_+)`` at row ``m``) or the bonus (a
          sample of row ``k``), ``tokens[b, m+1:] == PAD_TOKEN``. ``bonus=False``: when ``m == k``,
          ``tokens[b, k] == PAD_TOKEN``.
        * Randomness only from ``generator`` when one is given: the same generator state gives the same output; the
          global torch RNG is never read. Claiming ``row_generators``, ``generator`` may be a list of ``B`` entries
          (:mod:`specdec_ref.rng`): row ``b`` draws only from ``generator[b]``, a ``None`` entry is an unseeded row
          (the global RNG), and a row's output never depends on the other rows, its position or (trees) the batch's
          padded width: a seeded request reproduces alone or in any batch.
        """


@runtime_checkable
class TreeVerifier(Backend, Protocol):
    """A backend claiming ``tree``: verifies a tree of drafts per row in one call (EAGLE, Medusa, SpecInfer, Sequoia).

    ``Capabilities.tree_scheme`` names how sampled trees are drafted and judged (the suite drafts its trees by the
    declared scheme); at a node, ``r_1 = p`` (its target row), ``q`` its draft row, sibling ``j`` has token ``x``:

    * ``specinfer``: siblings drawn independently (with replacement) from ``q``; accept w.p. ``min(1, r_j(x)/q(x))``,
      ``r_{j+1} = norm([r_j - q]_+)``.
    * ``recursive``: siblings drawn from ``q`` without replacement; as ``specinfer`` with ``q_j`` = ``q`` without the
      earlier siblings, renormalised.
    * ``deterministic``: siblings any fixed distinct tokens (e.g. the draft's top-k); accept w.p. ``r_j(x)``,
      ``r_{j+1}`` = ``r_j`` without ``x``, renormalised.
    * ``lossy``: not claimed exact (acceptance thresholds below 1): measured (total variation), not failed.

    In every exact scheme, when all children of a node are rejected the final token is a sample of the last residual
    ``r``.
    """

    def verify_tree(
        self,
        draft_tokens: torch.Tensor,
        parents: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(draft_tokens Long[B, n], parents Long[B, n], draft_probs Float[B, n, V] | None,
        target_probs Float[B, n+1, V])`` -> ``(num_accepted Long[B], path Long[B, n], tokens Long[B, n+1])``.

        * Node ``i`` of row ``b`` carries token ``draft_tokens[b, i]`` and hangs under node ``parents[b, i]`` (``-1``:
          under the root, the committed text). Nodes are topologically ordered: ``-1 <= parents[b, i] < i``.
          Siblings are tried in index order.
        * Rows with fewer nodes are padded at the end: a padded node has ``draft_tokens[b, i] == -1`` (its parent,
          draft and target rows are ignored, not validated); a real node never follows one.
        * ``target_probs[b, 0]`` is the target's distribution at the root (``saved_next``), judging the root's
          children; ``target_probs[b, i + 1]`` the one after node ``i``'s path, judging node ``i``'s children (and
          the bonus when node ``i`` is a leaf).
        * ``draft_probs[b, i]`` is the draft distribution at node ``i``'s *parent*, the one ``i`` and its siblings were
          drawn from (before removing siblings already drawn, for ``recursive``); all siblings carry the same row.
          ``None`` means greedy (or a tree whose scheme ignores it).
        * Output: ``m = num_accepted[b]``; ``path[b, :m]`` the accepted nodes, root to node (each the child of the
          previous one, the first a child of the root), ``-1`` after; ``tokens[b, :m]`` their tokens, ``tokens[b, m]``
          the *final* token: the replacement sampled after all children of the last accepted node were rejected, or
          the bonus sampled from its target row when it is a leaf; ``-1`` after. A chain (``parents = [-1, 0, 1,
          ...]``) gives exactly the chain verifier's output.
        * Greedy (``draft_probs=None``, claiming ``greedy``): the longest path whose every node's token is its parent
          row's greedy choice; the final token is the greedy choice of the last node's row. Exact ties as for
          :meth:`Verifier.verify` (any maximiser).
        * Randomness only from ``generator`` (claiming ``row_generators``: a list of one per row, as for
          :meth:`Verifier.verify`); not claiming ``batched``: ``B == 1``.
        """


@runtime_checkable
class Decoder(Backend, Protocol):
    """A backend claiming ``decoder``: a full speculative decoder (:meth:`decode`, one request per call).

    The rules below hold for every decoding method a backend claims (``decode``, ``decode_batch``, ``decode_tree``,
    ``decode_tree_batch``).

    **Proposers** (``Capabilities.proposers``): ``draft`` need not be a draft model. Claiming ``proposer:NAME``, a
    decoder accepts that spec (plain data: tensors and numbers; :mod:`specdec_ref.proposers`,
    :mod:`specdec_ref.heads`) as ``draft`` and drafts with it:

    * ``draft_model``: a causal LM sharing the target's vocabulary (the default, always claimed).
    * ``ngram``: :class:`specdec_ref.proposers.Ngram` ``(min_n, max_n)``, prompt lookup by vLLM's rule: the tokens after
      the first earlier occurrence of the text's longest suffix of length in ``[min_n, max_n]``; fewer than ``k`` at
      the text's end, none without a match; one-hot.
    * ``eagle``: :class:`specdec_ref.heads.EagleHead`: ``h = layers(fc([embed(token), feature]))``,
      ``logits = lm_head(h)``, ``h`` the next step's feature; a token's feature is that of the position before it
      (the target's last hidden state after its final norm).
    * ``eagle3``: :class:`specdec_ref.heads.Eagle3Head`: EAGLE on the residual streams entering the target layers
      ``aux_layers`` (ascending), fused by ``fuse`` in the catch-up; a draft vocabulary (``lm_head [Vd, H]``, target
      id ``d + d2t[d]``, other ids ``-inf``).
    * ``mtp``: :class:`specdec_ref.heads.MtpHead`: ``out = norm(layers(fc([enorm(embed), hnorm(feature)])))``, the
      target's embedding and lm_head, ``out`` recycled, the embedding zeroed at position 0.
    * ``medusa``: :class:`specdec_ref.heads.MedusaHeads`: head ``i`` reads the feature that produced the pending
      token and proposes the token ``i + 1`` places after it.

    A spec whose ``sample`` is False drafts its argmax (one-hot: judged against ``q = one_hot(d)``, exact under every
    scheme); otherwise ``q`` is exactly what the drafts were drawn from (processed like a draft model's). The output
    law and greedy equality of :meth:`decode` hold whatever the proposer; acceptance is checked against its exact
    expectation on exactly-known heads (:mod:`specdec_ref.exact.heads`). A row whose prompt is one token has no
    feature before the target's first forward: its first round proposes nothing (a plain target step), so its draws
    never depend on its batch. With ``cache`` claimed, ``on_round``'s ``draft_cache`` for a head with decoder layers
    (EAGLE, EAGLE-3, MTP) shows their K/V (``layer_kv``): every position it holds is a fresh read of a committed pair
    (token ``c_p+1`` with the target's feature ``f_p``); it holds at least the pairs up to the round's pending token
    and none past the committed text (read in the next round's catch-up, or at once).

    Tree decoders (``Capabilities.tree_proposers``, required as ``tree_proposer:NAME``): with ``medusa``,
    ``decode_tree``'s ``draft`` is :class:`specdec_ref.heads.MedusaHeads`: level ``l``'s children come from head
    ``l - 1``'s row (the same row for every node of the level) by the declared tree scheme, and the next round's
    feature is the target's at the last *accepted* node. With ``eagle`` (``eagle3``, ``mtp``) it is that head, growing
    EAGLE-2's dynamic trees: a node's children come from the head's row after reading the node (paired with the hidden
    state that produced the node's own row), a level's expanded nodes in one tree-attention step of the head, and the
    next round's catch-up reads the committed tokens with the target's features of the pending token and the accepted
    path (:mod:`specdec_ref.tree_heads`).

    **Phase timings** (``phase_timings``, optional): every :class:`RoundRecord` (those passed to ``on_round`` and
    those in ``DecodeResult.rounds``) carries ``seconds``, a dict of wall seconds with the keys of :data:`PHASES`:
    ``draft`` (proposing the round's drafts), ``verify`` (the target's block forward, processing its rows and judging
    them, up to the host sync), ``repair`` (committing the tokens, rolling both caches back, the draft's catch-up
    feed), ``other`` (the rest of the round: per-row bookkeeping, ``on_round``, finished rows leaving); the first
    round's dict also has ``prefill``. The dict is complete when ``decode`` / ``decode_batch`` returns (``other``
    ends after ``on_round``); in a batch every row's record of one round holds the *same* dict. The phases of a call
    add up to its wall time less argument validation (a profile checks it within a stated tolerance).
    ``seconds = None``: not reported; claiming ``phase_timings``: every record carries them.

    **Drafts in the round records** (``round_drafts``, optional): every :class:`RoundRecord` of ``decode`` /
    ``decode_batch`` / ``decode_tree`` / ``decode_tree_batch`` carries ``drafts``: chain rounds the ``proposed`` draft
    tokens in order (``[]`` for a round without drafts, never a padding token past the rule's count); tree rounds every
    node's token in the order the tree verifier got them, with ``parents`` (the tree verifier's ``parents``: ``-1`` for
    the root's children) and, where the drafter reports them, ``draft_probs``: each node's probability in the row it
    was drawn from (its ``q``; greedy trees: the row its level's expansions are ranked by), or None. Not claimed, the
    three fields may be None: the drafts are judged by their counts and acceptance only (the checks note it).
    Claimed, a record without its drafts (or with a length other than ``proposed``) fails the check that reads it;
    drafts that differ from the proposer's exact rule fail, naming the round and node.

    **History-dependent sampling** (``history_sampling``): ``repetition_penalty``, ``presence_penalty``,
    ``frequency_penalty``, ``logit_bias``, ``min_new_tokens`` (EOS masked before it) and ``constraint`` (a
    :class:`specdec_ref.history.TokenAutomaton`: the allowed next tokens as a function of the generated history) act
    on the logits at every position of a block **on that position's hypothetical history**: the prompt, the committed
    tokens and the drafts before it; identically for the draft's proposals and the target's rows; rejected drafts
    never enter the history. The order (:func:`specdec_ref.history.process_logits`): logit bias, repetition penalty
    (tokens seen in the prompt or output), presence / frequency penalties (output tokens), the ``min_new_tokens`` EOS
    mask, the constraint, then temperature, top-k, top-p and ``min_p`` (claimed separately as ``min_p``). Each row's
    continuation law is tested against an independent float64 oracle of AR sampling under these settings.
    """

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
    ) -> DecodeResult:
        """Speculative decoding of ``prompt: Long[1, t]`` (one row, batch 1) with ``k`` drafts per round.

        * ``target`` / ``draft`` are transformers causal LMs sharing one vocabulary (``draft``: or a proposer spec).
          ``sampling`` (:class:`SamplingConfig`: ``greedy``, ``temperature``, ``top_k``, ``top_p``; :data:`GREEDY` is
          argmax) is applied identically to target and draft (:func:`specdec_ref.warp.warp`), so ``q`` is exactly
          what the draft sampled from.
        * Greedy decoding must equal plain autoregressive greedy decoding of the target; sampled decoding must follow
          the target's sequence law exactly (whatever the draft).
        * Bad input (empty prompt, ``k < 1``, ``max_new_tokens < 0``, ``eos_id`` outside the vocabulary, prompt ids
          out of range, target/draft vocabulary mismatch) raises ``ValueError`` (or ``TypeError``), never decodes.
        * EOS anywhere in a block ends generation right after it; at most ``max_new_tokens`` tokens are emitted.
          Nothing after an EOS is ever committed or cached.
        * Returns a :class:`DecodeResult`: ``tokens`` (generated ids, prompt excluded), ``finished_by`` (``"eos"`` |
          ``"max_new_tokens"``) and one :class:`RoundRecord` per round.
        * Claiming ``cache``: calls ``on_round(record, target_cache, draft_cache)`` after every round, once its caches
          are repaired; the caches offer ``layer_kv()`` (:class:`KVCache`). After every round ``record.target_len ==
          record.draft_len == record.committed_len - 1`` (both caches hold the committed tokens except the last,
          *pending* one, fed at the start of the next round), and every layer's K/V equals a fresh prefill of that
          prefix. Not claiming ``cache``: may call ``on_round`` or not.
        """


@runtime_checkable
class BatchedDecoder(Backend, Protocol):
    """A backend claiming ``batched_decoder``: decodes many requests at once, as engines do (the :class:`Decoder`
    rules on proposers, phase timings, round drafts and history-dependent sampling hold for every row)."""

    def decode_batch(self, target: Any, draft: Any, requests: list[Request], *, k: int,
                     on_round: RoundHook | None = None) -> list[DecodeResult]:
        """One :class:`DecodeResult` per request, in the requests' order.

        * Each :class:`Request` has its own ``prompt`` (any length >= 1), ``max_new_tokens``, :class:`SamplingConfig`
          (history-dependent settings included), ``eos_ids`` (``None``, an id or a collection of ids) and randomness:
          a ``generator``, a ``seed`` (the backend makes the generator), or neither (*unseeded*: the global RNG).
        * Rows are independent: every row accepts its own number of drafts each round and stops on its own (EOS,
          ``max_new_tokens``); a finished row leaves the batch and is never written again.
        * Batch invariance: a seeded request's output is bit-identical (float32) decoded alone, with any other
          requests (seeded or not), in any order; greedy rows equal AR greedy decoding of the request alone at every
          batch size. Unseeded rows follow the law, whatever their neighbours.
        * Stop invariants of every result: ``finished_by == "eos"`` iff the last token is one of the request's EOS
          ids, otherwise exactly ``max_new_tokens`` tokens; no EOS before the last token nor before
          ``min_new_tokens``; every round but the last emits ``accepted + 1`` tokens.
        * Claiming ``cache``: ``on_round(record, target_cache, draft_cache)`` runs after every round for every row
          still in the batch, with ``record.row`` its request index and that row's caches (the cache invariant of
          :meth:`Decoder.decode`, per row).
        * ``decode`` stays the one-request case: a backend claiming both must give the same results.
        """


@runtime_checkable
class CacheBackend(Backend, Protocol):
    """A backend claiming ``cache``."""

    def make_cache(self, model: Any) -> KVCache:
        """A fresh, empty :class:`KVCache` for ``model`` (batch 1)."""


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
    each claimed ``verifier`` / ``decoder`` / ``cache`` / ``tree`` / ``tree_decoder`` / ``batched_decoder`` /
    ``batched_tree_decoder`` has a callable ``verify`` / ``decode`` / ``make_cache`` / ``verify_tree`` /
    ``decode_tree`` / ``decode_batch`` / ``decode_tree_batch`` whose signature accepts the contract's call.
    Behaviour is the checks' job.
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
