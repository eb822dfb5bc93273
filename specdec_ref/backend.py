"""The reference backend: what ``pytest conformance/`` certifies by default."""
from __future__ import annotations

import dataclasses

import torch

from . import __version__
from .cache import ModelCache
from .contract import Capabilities
from .decode import SpeculativeDecoder
from .schemes import BlockwiseVerifier, OneHotDraftVerifier, TypicalAcceptanceVerifier
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
        dtypes=("float32", "float64", "bfloat16", "float16"),
        devices=("cpu", "cuda"),
    )

    def __init__(
        self,
        *,
        validate: bool = True,
        verifier: BlockVerifier = verify_block,
        decoder: SpeculativeDecoder | None = None,
    ):
        self.validate = validate
        self.verifier = verifier
        self.capabilities = dataclasses.replace(
            type(self).capabilities, scheme=getattr(verifier, "scheme", "token"), bonus=getattr(verifier, "bonus", True)
        )
        if self.capabilities.scheme != "token" or not self.capabilities.bonus:
            self.name = f"{type(self).name}[{self.capabilities.scheme_label()}]"
        self.decoder = decoder or SpeculativeDecoder(verifier=verifier)

    def verify(self, draft_tokens, draft_probs, target_probs, *, generator: torch.Generator | None = None):
        return self.verifier(draft_tokens, draft_probs, target_probs, generator=generator, validate=self.validate)

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
