"""Unit tests of the reference batched decoder: host syncs counted, the batch-1 API as its B = 1 case, request
validation, history state rolled back with the caches."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

from specdec_ref.contract import Request
from specdec_ref.decode import SpeculativeDecoder, batched_autoregressive_decode, batched_speculative_decode, speculative_decode
from specdec_ref.history import SamplingState, TokenAutomaton
from specdec_ref.models import make_draft, tiny_lm
from specdec_ref.static_cache import fastest_cache
from specdec_ref.warp import GREEDY, SamplingConfig

PENALISED = SamplingConfig(temperature=0.9, top_k=8, repetition_penalty=1.3, frequency_penalty=0.5, logit_bias={2: 1.0},
                           min_new_tokens=3)


@pytest.fixture(scope="module")
def pair():
    target = tiny_lm("llama", vocab_size=16, seed=5, init_scale=2.0)
    return target, make_draft(target, "noisy", noise=0.2, seed=6)


class HostReads(TorchFunctionMode):
    """Counts the tensor operations that read device data on the host (each one is a synchronisation on CUDA)."""

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
             torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.nonzero, torch.nonzero, torch.Tensor.cpu}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _requests():
    return [
        Request(prompt=[1, 2, 3], max_new_tokens=12, sampling=PENALISED, seed=1),
        Request(prompt=[4], max_new_tokens=7, sampling=GREEDY, eos_ids=9),
        Request(prompt=[5, 6, 7, 8, 9, 10], max_new_tokens=10, sampling=SamplingConfig(temperature=1.1, top_p=0.9), seed=2),
    ]


def test_one_host_read_per_round_for_the_whole_batch(pair):
    """Counted, not self-reported: the tensor reads that synchronise with the device are one per round for the
    whole batch (the emitted tokens); prompts given as lists of ints are range-checked and kept on the host (the
    sampling history and the first pending tokens come from those lists), so none at the start; none per drafted
    token, none per row per round. A prompt given as a tensor is read once, at validation."""
    target, draft = pair
    requests = _requests()
    batched_speculative_decode(target, draft, requests, k=4)  # warm up lazy initialisation
    rounds = {}
    for k in (2, 4):
        with HostReads() as reads:
            results = batched_speculative_decode(target, draft, requests, k=k)
        rounds[k] = max(len(r.rounds) for r in results)
        assert reads.count == rounds[k], f"k={k}: {reads.count} host reads for {rounds[k]} rounds"
    assert rounds[2] > rounds[4]  # the reads follow the rounds, not the drafts


def test_batch_one_api_is_the_one_request_case(pair):
    target, draft = pair
    for request in _requests():
        gen = torch.Generator().manual_seed(request.seed or 0)
        alone = speculative_decode(target, draft, torch.tensor([request.prompt]), k=3, max_new_tokens=request.max_new_tokens,
                                   sampling=request.sampling, eos_id=request.eos_ids, generator=gen)
        batched = batched_speculative_decode(target, draft, [Request(prompt=request.prompt, max_new_tokens=request.max_new_tokens,
                                                                     sampling=request.sampling, eos_ids=request.eos_ids,
                                                                     seed=request.seed or 0)], k=3)[0]
        assert alone.tokens == batched.tokens and alone.finished_by == batched.finished_by
        assert [r.accepted for r in alone.rounds] == [r.accepted for r in batched.rounds]


def test_batched_ar_rows_equal_ar_alone(pair):
    target, _ = pair
    requests = _requests()
    together = batched_autoregressive_decode(target, requests, make_cache=fastest_cache)
    for request, result in zip(requests, together):
        alone = batched_autoregressive_decode(target, [request], make_cache=fastest_cache)[0]
        assert result.tokens == alone.tokens


def test_min_new_tokens_masks_eos_per_row(pair):
    """A row whose EOS is the target's favourite still emits min_new_tokens tokens first; its neighbour, without the
    setting, stops at once."""
    target, draft = pair
    first = batched_autoregressive_decode(target, [Request(prompt=[3], max_new_tokens=1, sampling=GREEDY)], make_cache=fastest_cache)[0].tokens[0]
    floor = SamplingConfig(greedy=True, min_new_tokens=4)
    out = batched_speculative_decode(target, draft, [Request(prompt=[3], max_new_tokens=8, sampling=floor, eos_ids=first),
                                                     Request(prompt=[3], max_new_tokens=8, sampling=GREEDY, eos_ids=first)], k=3)
    assert out[1].tokens == [first] and out[1].finished_by == "eos"
    assert len(out[0].tokens) > 4 or out[0].finished_by == "max_new_tokens"
    assert first not in out[0].tokens[:4]


@pytest.mark.parametrize("bad, message", [
    ([], "non-empty list"),
    ([Request(prompt=[], max_new_tokens=3)], "request 0: prompt"),
    ([Request(prompt=[1], max_new_tokens=-1)], "request 0: max_new_tokens"),
    ([Request(prompt=[1], max_new_tokens=3), Request(prompt=[99], max_new_tokens=3)], "request 1: prompt"),
    ([Request(prompt=[1], max_new_tokens=3, eos_ids=[2, 16])], "eos id 16"),
    ([Request(prompt=[1], max_new_tokens=3, seed=1, generator=torch.Generator())], "not both"),
    ([Request(prompt=[1], max_new_tokens=3, sampling="greedy")], "SamplingConfig"),
    ([Request(prompt=[1], max_new_tokens=3, sampling=SamplingConfig(logit_bias={20: 1.0}))], "logit_bias"),
    ([Request(prompt=[1], max_new_tokens=3, sampling=SamplingConfig(constraint=TokenAutomaton(((0,) * 8,))))], "constraint"),
    ([Request(prompt=[1], max_new_tokens=400)], "max positions"),
])
def test_bad_requests_raise_naming_the_request(pair, bad, message):
    target, draft = pair
    with pytest.raises(ValueError, match=message):
        batched_speculative_decode(target, draft, bad, k=2)


def test_sampling_state_commits_only_the_kept_tokens():
    """The history after a round holds the committed tokens only; the block views add the drafts position by
    position (the rolled-back drafts never persist)."""
    config = SamplingConfig(frequency_penalty=1.0, repetition_penalty=1.5)
    state = SamplingState([[0, 1], [2]], [config, config], [None, None], 5, "cpu")
    drafts = torch.tensor([[3, 3, 4], [4, 1, 1]])
    views = state.positions(drafts)
    assert views["counts"][0, :, 3].tolist() == [0, 1, 2, 2]
    assert views["seen"][1, :, 1].tolist() == [False, False, True, True]
    assert views["generated"][1].tolist() == [0, 1, 2, 3]
    state.commit(drafts, torch.tensor([1, 2]))  # row 0 keeps d_1, row 1 keeps d_1 d_2
    assert state.counts.tolist() == [[0, 0, 0, 1, 0], [0, 1, 0, 0, 1]]
    assert state.generated.tolist() == [1, 2]
    assert state.seen[0].tolist() == [True, True, False, True, False]


def test_history_settings_without_state_are_an_error():
    from specdec_ref.history import process_logits

    with pytest.raises(ValueError, match="SamplingState"):
        process_logits(torch.zeros(1, 1, 4), [SamplingConfig(frequency_penalty=1.0)])


def test_decoder_hooks_see_every_live_row(pair):
    """on_round runs for every row still in the batch after every round, with that row's index and caches."""
    target, draft = pair
    requests = _requests()
    seen = []
    results = SpeculativeDecoder().decode_batch(target, draft, requests, k=3,
                                                on_round=lambda record, t, d: seen.append((record.row, record.round, t.tentative_length)))
    for i, result in enumerate(results):
        rows = [(r, length) for row, r, length in seen if row == i]
        assert [r for r, _ in rows] == list(range(len(result.rounds)))
        assert [length for _, length in rows] == [rec.committed_len - 1 for rec in result.rounds]


class HostCopies(TorchFunctionMode):
    """Counts tensors built from host data (``torch.tensor`` / ``as_tensor``): on an accelerator each one is a blocking
    copy, so the per-position sampling steps must not make any once their constants exist."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.tensor, torch.as_tensor):
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_history_steps_copy_nothing_from_the_host_per_position():
    from specdec_ref.history import process_logits

    configs = [PENALISED, SamplingConfig(temperature=0.7, logit_bias={1: -1.0}, min_new_tokens=2), PENALISED]
    state = SamplingState([[1, 2], [3], [4, 5, 6]], configs, [9, (9, 4), None], 16, "cpu")
    logits, drafts = torch.randn(3, 3, 16), torch.randint(0, 16, (3, 2))
    first = process_logits(logits, configs, state, drafts)  # builds the constants once
    with HostCopies() as copies:
        again = process_logits(logits, configs, state, drafts)
    assert copies.count == 0 and torch.equal(first, again)


def test_mixed_settings_groups_differ_by_the_stated_tv_and_old_checks_cannot_see_a_neighbour_mix_up():
    """batch_mixed_settings_law's premise: its two groups' exact laws are TV 0.613 apart, so a row sampled with its
    neighbour's settings is far from its law; the reference passes it and settings_from_neighbour_row fails it (dev
    scale), while batch_sequence_law (one setting per batch) lets that mutant through."""
    from conformance.batch_checks import MIXED_TV_BETWEEN_GROUPS, mixed_group_law
    from conformance.registry import CheckContext, all_cases, run_case
    from specdec_fixtures.mutants.batch import SettingsFromNeighbourRow
    from specdec_ref.backend import ReferenceBackend, reference_backend

    a, b = dict(mixed_group_law(0)), dict(mixed_group_law(1))
    assert round(0.5 * sum(abs(a.get(x, 0.0) - b.get(x, 0.0)) for x in set(a) | set(b)), 3) == MIXED_TV_BETWEEN_GROUPS
    (case,) = all_cases(["batch_mixed_settings_law"])
    dev = CheckContext(profile="dev")
    assert run_case(case, reference_backend(), dev).status == "passed"
    mutant = ReferenceBackend(decoder=SettingsFromNeighbourRow())
    record = run_case(case, mutant, dev)
    assert record.status == "failed" and "settings group 0" in record.message, record.message[:1500]
    penalties = next(c for c in all_cases(["batch_sequence_law"]) if c.case_id == "penalties")
    assert run_case(penalties, mutant, dev).status == "passed"


def test_only_the_filtered_efficiency_cases_see_a_batched_draft_that_filters_before_its_temperature():
    """batch_acceptance_under_filters' premise: the batch mutant (each row's draft filtered before its temperature, on
    its own history) fails every case, while batch_acceptance_is_ideal (temperature 1: the order cannot matter) lets it
    through at the full ci sample."""
    from conformance.registry import CheckContext, all_cases, run_case
    from specdec_fixtures.mutants.batch import DraftFiltersBeforeTemperature
    from specdec_ref.backend import ReferenceBackend

    mutant = ReferenceBackend(decoder=DraftFiltersBeforeTemperature())
    ci = CheckContext(profile="ci")
    for case in all_cases(["batch_acceptance_under_filters"]):
        record = run_case(case, mutant, ci)
        assert record.status == "failed", (case.id, record.message[:1500])
    (old,) = all_cases(["batch_acceptance_is_ideal"])
    record = run_case(old, mutant, ci)
    assert record.status == "passed", record.message[:1500]


@pytest.mark.parametrize("name", ["greedy_fallback_at_position_limit", "room_from_first_row"])
def test_only_the_position_limit_case_sees_the_batched_position_limit_mutants(name):
    """batch_position_limit_law's premise: every older batch law case and the greedy-equality check end far below the
    models' maximum positions, so a wrong fallback step or room taken from the first row goes unseen there (dev scale)."""
    from conformance.registry import CheckContext, all_cases, run_case
    from specdec_fixtures.mutants import MUTANTS

    mutant = MUTANTS[name].backend()
    dev = CheckContext(profile="dev")
    for case in all_cases(["batch_sequence_law", "batch_greedy_equals_ar_at_every_batch_size"]):
        record = run_case(case, mutant, dev)
        assert record.status in ("passed", "skipped"), (case.id, record.status, record.message[:1500])
    (new,) = all_cases(["batch_position_limit_law"])
    assert run_case(new, mutant, CheckContext(profile="ci")).status in ("failed", "error")


def test_decoder_loops_run_without_autograd_bookkeeping():
    """The decoders' loops run under ``torch.inference_mode`` (their many small ops skip autograd's dispatch and
    version counters: about 6-8% of a decode, docs/benchmarks.md), what a round hook sees included; nothing made in
    the loop escapes it: the results are host lists, and the models' weights stay ordinary tensors that can be
    edited in place afterwards (an inference tensor refuses that edit); the edited model then decodes as a fresh copy
    of it does."""
    import copy

    from specdec_ref.tree_decode import TreeSpeculativeDecoder

    target = tiny_lm("llama", vocab_size=16, seed=7, init_scale=2.0)  # its own: the test edits it in place
    draft = make_draft(target, "noisy", noise=0.2, seed=8)
    seen = []
    hook = lambda record, *caches: seen.append(torch.is_inference_mode_enabled())  # noqa: E731
    requests = [Request(prompt=[1, 2, 3], max_new_tokens=6, sampling=GREEDY)]
    before = SpeculativeDecoder().decode_batch(target, draft, requests, k=3, on_round=hook)[0].tokens
    tree = TreeSpeculativeDecoder()
    tree.decode(target, draft, torch.tensor([[1, 2, 3]]), depth=2, width=2, max_new_tokens=6, on_round=hook)
    tree.decode_tree_batch(target, draft, requests, depth=2, width=2, on_round=hook)
    batched_autoregressive_decode(target, requests, on_step=hook)
    assert len(seen) >= 4 and all(seen), f"a decoder's round ran with autograd bookkeeping on: {seen}"
    assert not torch.is_inference_mode_enabled()
    assert all(type(t) is int for t in before)
    with torch.no_grad():
        for p in target.parameters():
            assert not p.is_inference()
            p.mul_(-0.5)  # in place, outside inference mode: allowed only on ordinary tensors
    fresh = copy.deepcopy(target)
    for decode in (lambda m: SpeculativeDecoder().decode_batch(m, draft, requests, k=3)[0].tokens,
                   lambda m: batched_autoregressive_decode(m, requests)[0].tokens):
        assert decode(target) == decode(fresh)  # the edit is read, by the same code on the same numbers
