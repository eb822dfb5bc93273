"""The reference backend: what ``pytest conformance/`` certifies by default."""
from __future__ import annotations

import dataclasses

import torch

from . import __version__
from .cache import ModelCache
from .contract import Capabilities
from .decode import SpeculativeDecoder
from .row_products import request_row_independent_products
from .schemes import BlockwiseVerifier, OneHotDraftVerifier, TypicalAcceptanceVerifier
from .tree import DeterministicTreeVerifier, RecursiveTreeVerifier, SpecInferTreeVerifier, TreeVerifierBase
from .tree_decode import TreeSpeculativeDecoder
from .verify import BlockVerifier, verify_block


class ReferenceBackend:
    """specdec_ref's own verifier behind the backend contract.

    The declared scheme (``capabilities.scheme`` / ``bonus``) is the verifier's own, so the same
    class serves every reference scheme (:mod:`specdec_ref.schemes`).
    """

    name = "specdec_ref.reference"
    version = __version__
    capabilities = Capabilities(
        verifier=True,
        greedy=True,
        sampling=True,
        batched=True,
        cache=True,
        decoder=True,
        top_k=True,
        top_p=True,
        tree=True,
        row_generators=True,
        tree_decoder=True,
        batched_decoder=True,
        batched_tree_decoder=True,
        min_p=True,
        history_sampling=True,
        phase_timings=True,
        round_drafts=True,
        dtypes=("float32", "float64", "bfloat16", "float16"),
        devices=("cpu", "cuda"),
        proposers=("draft_model", "ngram", "eagle", "eagle3", "medusa", "mtp"),
        tree_proposers=("draft_model", "medusa", "eagle", "eagle3", "mtp"),
        batched_tree_proposers=("draft_model", "medusa"),
    )

    def __init__(
        self,
        *,
        validate: bool = True,
        verifier: BlockVerifier = verify_block,
        decoder: SpeculativeDecoder | None = None,
        tree_verifier: TreeVerifierBase | None = None,
        tree_decoder: TreeSpeculativeDecoder | None = None,
    ):
        request_row_independent_products()  # batched_decoder claims seeded batch invariance (docs/batching.md)
        self.validate = validate
        self.verifier = verifier
        self.tree_verifier = tree_verifier or SpecInferTreeVerifier()
        self.capabilities = dataclasses.replace(
            type(self).capabilities,
            scheme=getattr(verifier, "scheme", "token"),
            bonus=getattr(verifier, "bonus", True),
            tree_scheme=self.tree_verifier.tree_scheme,
        )
        labels = []
        if self.capabilities.scheme != "token" or not self.capabilities.bonus:
            labels.append(self.capabilities.scheme_label())
        if self.capabilities.tree_scheme != "specinfer":
            labels.append(f"tree {self.capabilities.tree_scheme}")
        if labels:
            self.name = f"{type(self).name}[{'; '.join(labels)}]"
        self.decoder = decoder or SpeculativeDecoder(verifier=verifier)
        self.tree_decoder = tree_decoder or TreeSpeculativeDecoder(tree_verifier=self.tree_verifier)

    def verify(self, draft_tokens, draft_probs, target_probs, *, generator: torch.Generator | None = None):
        return self.verifier(draft_tokens, draft_probs, target_probs, generator=generator, validate=self.validate)

    def verify_tree(self, draft_tokens, parents, draft_probs, target_probs, *, generator: torch.Generator | None = None):
        """Tree verification (:mod:`specdec_ref.tree`) with the declared ``tree_scheme``."""
        return self.tree_verifier(draft_tokens, parents, draft_probs, target_probs, generator=generator, validate=self.validate)

    def decode(self, target, draft, prompt, *, k, max_new_tokens, sampling, eos_id=None, generator=None, on_round=None):
        """Speculative decoding (batch 1); ``on_round(record, target_cache, draft_cache)`` after every round."""
        return self.decoder.decode(
            target,
            draft,
            prompt,
            k=k,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            eos_id=eos_id,
            generator=generator,
            on_round=on_round,
        )

    def decode_batch(self, target, draft, requests, *, k, on_round=None):
        """Batched speculative decoding (:meth:`specdec_ref.decode.SpeculativeDecoder.decode_batch`): one result per
        request; ``on_round(record, target_cache, draft_cache)`` per row still in the batch after every round."""
        return self.decoder.decode_batch(target, draft, requests, k=k, on_round=on_round)

    def decode_tree(
        self, target, draft, prompt, *, depth, width, max_new_tokens, sampling, eos_id=None, generator=None, on_round=None
    ):
        """Tree speculative decoding (batch 1, :mod:`specdec_ref.tree_decode`): ``depth`` levels of ``width``
        children per round, drafted and judged by the declared ``tree_scheme``; ``on_round`` after every round."""
        return self.tree_decoder.decode(
            target,
            draft,
            prompt,
            depth=depth,
            width=width,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            eos_id=eos_id,
            generator=generator,
            on_round=on_round,
        )

    def decode_tree_batch(self, target, draft, requests, *, depth, width, on_round=None):
        """Batched tree speculative decoding (:mod:`specdec_ref.tree_batch`): one result per request, each row's
        draws from its own generator (a seeded request gives what :meth:`decode_tree` gives it alone)."""
        return self.tree_decoder.decode_tree_batch(target, draft, requests, depth=depth, width=width, on_round=on_round)

    def make_cache(self, model) -> ModelCache:
        """The KV cache adapter the decoder uses (checked by the stateful cache machine)."""
        return self.decoder.make_cache(model)


def reference_backend() -> ReferenceBackend:
    """Factory named by the default ``--specdec-backend``."""
    return ReferenceBackend()


def one_hot_draft_backend() -> ReferenceBackend:
    """The reference with the ``one_hot_draft`` scheme (:class:`~specdec_ref.schemes.OneHotDraftVerifier`)."""
    return ReferenceBackend(verifier=OneHotDraftVerifier())


def block_backend() -> ReferenceBackend:
    """The reference with block verification (:class:`~specdec_ref.schemes.BlockwiseVerifier`)."""
    return ReferenceBackend(verifier=BlockwiseVerifier())


def no_bonus_backend() -> ReferenceBackend:
    """The token-wise reference without the bonus token (scheme ``token``, ``bonus=False``)."""
    return ReferenceBackend(verifier=BlockVerifier(bonus=False))


def typical_backend() -> ReferenceBackend:
    """Medusa typical acceptance, declared ``lossy`` (:class:`~specdec_ref.schemes.TypicalAcceptanceVerifier`)."""
    return ReferenceBackend(verifier=TypicalAcceptanceVerifier())


def recursive_tree_backend() -> ReferenceBackend:
    """The reference with recursive rejection sampling for trees drafted without replacement."""
    return ReferenceBackend(tree_verifier=RecursiveTreeVerifier())


def deterministic_tree_backend() -> ReferenceBackend:
    """The reference with sequential one-hot acceptance for deterministic (top-k) trees."""
    return ReferenceBackend(tree_verifier=DeterministicTreeVerifier())
