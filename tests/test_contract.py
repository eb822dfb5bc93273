"""specdec_ref.contract: opt-in capabilities, runtime-checkable protocols and check_backend's messages."""
import dataclasses

import pytest

import specdec_ref.contract as contract
from examples.numpy_backend import factory as numpy_backend
from specdec_fixtures.mutants import MUTANTS
from specdec_ref.backend import reference_backend
from specdec_ref.contract import (
    CAPABILITY_FLAGS,
    Backend,
    CacheBackend,
    Capabilities,
    ContractError,
    Decoder,
    KVCache,
    Verifier,
    check_backend,
)
from specdec_ref.models import tiny_lm


def test_every_flag_defaults_to_false():
    caps = Capabilities()
    assert not any(caps.has(flag) for flag in CAPABILITY_FLAGS)
    assert (caps.dtypes, caps.devices) == (("float32",), ("cpu",))
    assert caps.has("dtype:float32") and not caps.has("dtype:bfloat16") and caps.has("device:cpu")
    assert caps.has("proposer:draft_model") and not caps.has("proposer:eagle")  # a draft model: what every decoder takes
    assert caps.has("tree_proposer:draft_model") and not caps.has("tree_proposer:medusa")
    assert caps.as_dict() == {
        **{flag: False for flag in CAPABILITY_FLAGS}, "dtypes": ("float32",), "devices": ("cpu",),
        "proposers": ("draft_model",), "tree_proposers": ("draft_model",), "batched_tree_proposers": ("draft_model",),
        "scheme": "token", "bonus": True,
        "tree_scheme": "specinfer",
    }
    with pytest.raises(ValueError, match="batched_tree_proposers"):
        Capabilities(batched_tree_decoder=True, batched_tree_proposers=("medusa",))
    with pytest.raises(ValueError, match="unknown proposer"):
        Capabilities(proposers=("draft_model", "lookahead"))
    with pytest.raises(ValueError, match="unknown tree proposer"):
        Capabilities(tree_proposers=("draft_model", "ngram"))
    with pytest.raises(ValueError, match="unknown capability"):
        caps.has("tree_proposer:ngram")


def test_public_names():
    assert set(contract.__all__) <= set(dir(contract))
    assert "VerifierBackend" not in dir(contract)
    from specdec_ref.contract import GREEDY, DecodeResult, RoundRecord, SamplingConfig  # noqa: F401
    from specdec_ref.decode import DecodeResult as FromDecode
    from specdec_ref.warp import SamplingConfig as FromWarp

    assert FromDecode is DecodeResult and FromWarp is SamplingConfig and GREEDY.greedy


class _Bare:
    name, version = "bare", "0"

    def __init__(self, **flags):
        self.capabilities = Capabilities(**flags)


@pytest.mark.parametrize(
    "flag, method",
    [("verifier", "verify(draft_tokens, draft_probs, target_probs"), ("decoder", "decode(target, draft, prompt"),
     ("cache", "make_cache(model)")],
)
def test_claimed_capability_without_its_method_names_both(flag, method):
    with pytest.raises(ContractError) as info:
        check_backend(_Bare(**{flag: True}))
    assert f"claims {flag!r} but has no callable {method}" in str(info.value)


def test_method_that_is_not_callable_or_has_the_wrong_signature():
    backend = _Bare(verifier=True)
    backend.verify = "not a function"
    with pytest.raises(ContractError, match="claims 'verifier' but has no callable verify"):
        check_backend(backend)
    backend.verify = lambda draft_tokens, draft_probs, target_probs: None  # no generator keyword
    with pytest.raises(ContractError, match="claims 'verifier' but verify.*cannot be called as .*generator"):
        check_backend(backend)
    backend.verify = lambda *args, **kwargs: None
    check_backend(backend)


def test_declarations_themselves():
    with pytest.raises(ContractError, match="must be a specdec_ref.contract.Capabilities, got dict"):
        check_backend(type("B", (), {"name": "b", "capabilities": {"verifier": True}})())
    with pytest.raises(ContractError, match="has no 'name'"):
        check_backend(type("B", (), {"capabilities": Capabilities()})())
    assert issubclass(ContractError, TypeError)
    check_backend(_Bare())  # claims nothing, needs nothing


def test_shipped_backends_pass_check_backend():
    check_backend(reference_backend())
    check_backend(numpy_backend())
    for mutant in MUTANTS.values():
        check_backend(mutant.backend())


def test_protocols_are_runtime_checkable():
    ref = reference_backend()
    assert isinstance(ref, Backend) and isinstance(ref, Verifier) and isinstance(ref, Decoder)
    assert isinstance(ref, CacheBackend) and isinstance(ref.make_cache(tiny_lm("llama")), KVCache)
    example = numpy_backend()
    assert isinstance(example, Verifier) and not isinstance(example, Decoder) and not isinstance(example, CacheBackend)
    assert not isinstance(object(), Backend)


def test_capabilities_stay_frozen_and_replaceable():
    caps = Capabilities(verifier=True, greedy=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.verifier = False
    assert dataclasses.replace(caps, greedy=False).has("verifier")
    with pytest.raises(ValueError, match="unknown capability"):
        caps.has("speculative")
