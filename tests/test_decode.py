"""Unit tests of the reference decoders: alignment, records, host syncs, limits, validation."""
import pytest
import torch

from conformance.registry import CheckContext, all_cases, run_case
from specdec_ref.backend import ReferenceBackend
from specdec_ref.decode import SpeculativeDecoder, autoregressive_decode, speculative_decode
from specdec_ref.models import make_draft, next_token_logits, tiny_lm
from specdec_ref.verify import BlockVerifier
from specdec_ref.warp import GREEDY, SamplingConfig, warp


@pytest.fixture(scope="module")
def pair():
    target = tiny_lm("llama", vocab_size=16, seed=5, init_scale=2.0)
    return target, make_draft(target, "noisy", noise=0.05, seed=6)


class RecordingVerifier(BlockVerifier):
    def __init__(self):
        self.calls = []

    def __call__(self, draft_tokens, draft_probs, target_probs, **kw):
        out = super().__call__(draft_tokens, draft_probs, target_probs, **kw)
        self.calls.append((draft_tokens.clone(), target_probs.clone(), out[0].clone()))
        return out


def test_alignment_row_i_judges_draft_i_plus_1(pair):
    """The design's alignment test: every row handed to the verifier equals serial decoding's distribution
    for the position of the candidate it judges (row 0 = saved_next, row k = bonus)."""
    target, draft = pair
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    verifier = RecordingVerifier()
    result = SpeculativeDecoder(verifier=verifier).decode(target, draft, prompt, k=3, max_new_tokens=12)
    sequence = prompt[0].tolist() + result.tokens
    lines = []
    for call, (drafts, rows, m), record in zip(range(len(verifier.calls)), verifier.calls, result.rounds):
        start = record.start
        for i in range(rows.shape[1]):
            prefix = sequence[:start] + drafts[0, :i].tolist()
            serial = torch.softmax(next_token_logits(target, torch.tensor([prefix]))[0, -1], -1)
            judged = drafts[0, i].item() if i < drafts.shape[1] else "bonus"
            lines.append(f"round {call} row {i}: prefix ...{prefix[-4:]} judges {judged}; serial argmax {int(serial.argmax())}")
            assert torch.allclose(rows[0, i], serial, atol=1e-5), "\n".join(lines)


def test_one_host_sync_and_one_target_call_per_round(pair):
    target, draft = pair
    result = speculative_decode(target, draft, torch.tensor([[1, 2, 3]]), k=4, max_new_tokens=30)
    assert result.host_syncs == len(result.rounds)
    assert result.target_calls == len(result.rounds) + 1  # + the prompt prefill
    assert len(result.tokens) == 30
    assert [r.committed_len for r in result.rounds][-1] == 33
    assert all(r.target_len == r.draft_len == r.committed_len - 1 for r in result.rounds)


@pytest.mark.parametrize("k,max_new", [(1, 1), (8, 3), (4, 0), (3, 7)])
def test_max_new_tokens_is_exact(pair, k, max_new):
    target, draft = pair
    for sampling in (GREEDY, SamplingConfig(temperature=0.9)):
        result = speculative_decode(
            target, draft, torch.tensor([[7]]), k=k, max_new_tokens=max_new, sampling=sampling, generator=torch.Generator().manual_seed(0)
        )
        assert len(result.tokens) == max_new


def test_sampling_is_reproducible_and_seed_dependent(pair):
    target, draft = pair
    run = lambda s: speculative_decode(  # noqa: E731
        target, draft, torch.tensor([[1, 2]]), k=3, max_new_tokens=40, sampling=SamplingConfig(temperature=1.0),
        generator=torch.Generator().manual_seed(s),
    ).tokens
    assert run(1) == run(1) and run(1) != run(2)


def test_timed_decode_reports_phases(pair):
    target, draft = pair
    result = SpeculativeDecoder().decode(target, draft, torch.tensor([[1, 2]]), k=3, max_new_tokens=10, timed=True)
    assert set(result.seconds) == {"prefill", "draft", "verify", "repair"} and all(v >= 0 for v in result.seconds.values())


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"prompt": torch.zeros(1, 0, dtype=torch.long)}, "prompt is empty"),
        ({"k": 0}, "k must be"),
        ({"max_new_tokens": -1}, "max_new_tokens must be"),
        ({"eos_id": 16}, "eos_id must be"),
        ({"prompt": torch.tensor([[1, 16]])}, "prompt token ids"),
        ({"prompt": torch.tensor([[1.0, 2.0]])}, "prompt must be"),
        ({"max_new_tokens": 300}, "exceeds the models' max positions"),
        ({"sampling": {"temperature": 1}}, "sampling must be a SamplingConfig"),
    ],
)
def test_bad_decode_arguments_raise(pair, kwargs, message):
    target, draft = pair
    args = {"prompt": torch.tensor([[1, 2]]), "k": 2, "max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        speculative_decode(target, draft, args.pop("prompt"), **args)


def test_vocab_mismatch_raises(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        speculative_decode(target, tiny_lm("llama", vocab_size=12), torch.tensor([[1]]), k=2, max_new_tokens=2)


@pytest.mark.parametrize("bad", [{"temperature": 0}, {"temperature": float("nan")}, {"top_k": 0}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_bad_sampling_config_raises(bad):
    with pytest.raises(ValueError):
        SamplingConfig(**bad)


def test_warp_top_k_and_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    assert (warp(logits, SamplingConfig(top_k=2))[0, 2:] == 0).all()
    probs = torch.softmax(logits, -1)[0]
    kept = warp(logits, SamplingConfig(top_p=float(probs[0]) + 1e-3))[0]
    assert (kept[:2] > 0).all() and (kept[2:] == 0).all()
    assert torch.allclose(warp(logits, SamplingConfig(temperature=2.0)), torch.softmax(logits / 2, -1))


def test_ar_decode_stops_at_eos(pair):
    target, _ = pair
    plain = autoregressive_decode(target, torch.tensor([[1, 2]]), max_new_tokens=10)
    eos = plain.tokens[4]
    stopped = autoregressive_decode(target, torch.tensor([[1, 2]]), max_new_tokens=10, eos_id=eos)
    assert stopped.tokens == plain.tokens[: plain.tokens.index(eos) + 1] and stopped.finished_by == "eos"


class AcceptsAnything(ReferenceBackend):
    """Swallows bad arguments and returns an empty result: a silent wrong answer."""

    def decode(self, *args, **kwargs):
        try:
            return super().decode(*args, **kwargs)
        except ValueError:
            return autoregressive_decode(args[0], torch.tensor([[1]]), max_new_tokens=0)


def test_decoder_check_fails_on_a_backend_accepting_bad_input():
    (case,) = all_cases(["decoder_rejects_bad_input"])
    assert run_case(case, AcceptsAnything(), CheckContext()).status == "failed"
    assert run_case(case, ReferenceBackend(), CheckContext()).status == "passed"


def test_bf16_check_needs_a_bf16_claim():
    import dataclasses

    from conformance.registry import missing_capabilities

    (case, *_) = all_cases(["decoder_greedy_bf16_divergences_are_flips"])
    backend = ReferenceBackend()
    assert missing_capabilities(case, backend) == []
    backend.capabilities = dataclasses.replace(backend.capabilities, dtypes=("float32",))
    assert missing_capabilities(case, backend) == ["dtype:bfloat16"]
    assert run_case(case, backend, CheckContext()).status == "skipped"
