"""The batched tree decoder (specdec_ref.tree_batch): a seeded request decodes bit for bit as it does alone with
``decode_tree``, in a batch of other prompts, settings, lengths and tree shapes; greedy rows equal AR; after every
round each row's caches hold its committed tokens but the pending one, K/V equal to a fresh prefill."""
import pytest
import torch

from conformance.decoder_checks import _cache_hook, model_pair, prompts
from specdec_ref.backend import ReferenceBackend, reference_backend
from specdec_ref.cache import batched_tree_layout, tree_layout
from specdec_ref.contract import NotSupportedError, Request
from specdec_ref.decode import autoregressive_decode
from specdec_ref.models import make_draft, tiny_lm
from specdec_ref.tree import DeterministicTreeVerifier, RecursiveTreeVerifier, SpecInferTreeVerifier
from specdec_ref.tree_decode import TreeSpeculativeDecoder
from specdec_ref.warp import GREEDY, SamplingConfig

SETTINGS = [SamplingConfig(temperature=0.9, top_k=6), GREEDY, SamplingConfig(temperature=1.3, top_p=0.8)]


def _requests(prompt_list, n, seed=0, eos=None):
    out = []
    for i in range(n):
        prompt = prompt_list[i % len(prompt_list)][0].tolist()
        out.append(Request(prompt=prompt, max_new_tokens=6 + 5 * (i % 3), sampling=SETTINGS[i % len(SETTINGS)],
                           eos_ids=eos, generator=torch.Generator().manual_seed(seed + i)))
    return out


def _alone(decoder, target, draft, r, depth, width, seed):
    return decoder.decode(target, draft, torch.tensor([r.prompt]), depth=depth, width=width, max_new_tokens=r.max_new_tokens,
                          sampling=r.sampling, eos_id=r.eos_ids, generator=torch.Generator().manual_seed(seed))


def test_batched_tree_layout_is_the_layout_of_each_row():
    parents = torch.tensor([[-1, -1, 0, 0, 1, 2], [-1, 0, 1, -1, 3, 3], [-1, -1, -1, 2, 2, 4]])
    depth, ancestors = batched_tree_layout(parents)
    for b in range(parents.shape[0]):
        d, a = tree_layout(parents[b])
        assert torch.equal(depth[b], d) and torch.equal(ancestors[b], a)


@pytest.mark.parametrize("verifier", [SpecInferTreeVerifier, RecursiveTreeVerifier, DeterministicTreeVerifier])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_a_seeded_row_is_what_decode_tree_gives_it_alone(arch, verifier):
    """Mixed prompts, settings (greedy among sampled rows), lengths and EOS; rows leave at different rounds."""
    decoder = TreeSpeculativeDecoder(tree_verifier=verifier())
    target, draft = model_pair(arch, "noisy", 0.3)
    for depth, width in ((2, 2), (3, 3), (1, 4)):
        requests = _requests(prompts(11, 3), 9, seed=40, eos=3)  # fresh generators
        rows = decoder.decode_tree_batch(target, draft, requests, depth=depth, width=width)
        for i, r in enumerate(requests):
            alone = _alone(decoder, target, draft, r, depth, width, 40 + i)
            assert rows[i].tokens == alone.tokens, (arch, verifier.__name__, depth, width, i)
            assert rows[i].finished_by == alone.finished_by
            assert [(x.proposed, x.accepted, x.emitted) for x in rows[i].rounds] == \
                   [(x.proposed, x.accepted, x.emitted) for x in alone.rounds]


def test_greedy_rows_equal_ar_and_every_rows_caches_equal_a_prefill_every_round():
    decoder = TreeSpeculativeDecoder()
    target, draft = model_pair("llama", "noisy", 0.2)
    prompt_list = prompts(5, 4)
    ars = [autoregressive_decode(target, p, max_new_tokens=14).tokens for p in prompt_list]
    requests = [Request(prompt=p[0].tolist(), max_new_tokens=14, sampling=GREEDY) for p in prompt_list]
    hooks = [_cache_hook(target, draft, p[0].tolist() + ar, f"row {i}") for i, (p, ar) in enumerate(zip(prompt_list, ars))]
    seen = []

    def on_round(record, target_cache, draft_cache):
        seen.append(record.row)
        hooks[record.row](record, target_cache, draft_cache)

    rows = decoder.decode_tree_batch(target, draft, requests, depth=3, width=2, on_round=on_round)
    assert [r.tokens for r in rows] == ars
    assert sorted(set(seen)) == [0, 1, 2, 3]


def test_rows_near_the_position_limit_shrink_their_trees_on_their_own():
    """Prompts ending 1 .. 6 positions below a 32-position target: every row's trees shrink (then give way to plain
    steps) as it would alone, while its neighbours keep full trees (groups of shapes within one round)."""
    target = tiny_lm("llama", vocab_size=16, seed=21, init_scale=2.0, max_positions=32)
    draft = make_draft(target, "noisy", noise=0.1, seed=22)
    decoder = TreeSpeculativeDecoder()
    requests = []
    for j in range(1, 7):
        prompt = [(3 * i + j) % 16 for i in range(32 - j)]
        for s, sampling in enumerate((GREEDY, SETTINGS[0])):
            requests.append(Request(prompt=prompt[: 32 - j - 3 * s] if s else prompt, max_new_tokens=j + 1,
                                    sampling=sampling, generator=torch.Generator().manual_seed(j)))
    hook_rows = []
    rows = decoder.decode_tree_batch(target, draft, requests, depth=3, width=2,
                                     on_round=lambda rec, t, d: hook_rows.append(rec.target_len == rec.draft_len == rec.committed_len - 1))
    assert all(hook_rows)
    for i, r in enumerate(requests):
        alone = _alone(decoder, target, draft, r, 3, 2, r.generator.initial_seed())
        assert rows[i].tokens == alone.tokens, i


def test_bad_input_is_a_clear_error():
    decoder = TreeSpeculativeDecoder()
    target, draft = model_pair("llama", "noisy", 0.2)
    ok = [Request(prompt=[1, 2], max_new_tokens=3, sampling=GREEDY)]
    with pytest.raises(ValueError, match="depth must be an int >= 1"):
        decoder.decode_tree_batch(target, draft, ok, depth=0, width=2)
    with pytest.raises(ValueError, match="request 0: max_new_tokens"):
        decoder.decode_tree_batch(target, draft, [Request(prompt=[1], max_new_tokens=-1, sampling=GREEDY)], depth=2, width=2)
    from specdec_ref.exact.heads import exact_eagle_head
    from specdec_ref.exact import exact_pair

    exact = exact_pair("order1-close").target.load(torch.float32)
    with pytest.raises(NotSupportedError, match="eagle trees decode one request at a time"):
        decoder.decode_tree_batch(exact, exact_eagle_head(exact, "order1-target"), ok, depth=2, width=2)
    with pytest.raises(NotSupportedError, match="history-dependent"):
        decoder.decode_tree_batch(target, draft, [Request(prompt=[1], max_new_tokens=2,
                                                          sampling=SamplingConfig(repetition_penalty=1.5))], depth=2, width=2)


def test_the_reference_backend_claims_and_serves_batched_trees():
    backend = reference_backend()
    assert backend.capabilities.has("batched_tree_decoder")
    target, draft = model_pair("qwen2", "noisy", 0.2)
    rows = backend.decode_tree_batch(target, draft, [Request(prompt=[1, 2, 3], max_new_tokens=5, sampling=GREEDY)],
                                     depth=2, width=2)
    assert rows[0].tokens == autoregressive_decode(target, torch.tensor([[1, 2, 3]]), max_new_tokens=5).tokens
    assert isinstance(ReferenceBackend().tree_decoder, TreeSpeculativeDecoder)


def test_medusa_rows_are_what_decode_tree_gives_each_alone():
    """Medusa heads (no draft forward; the next feature is the target's at the last kept node): one-token prompts start
    with a plain step (no feature yet) while their neighbours draft; every row equals its decode_tree alone."""
    from specdec_ref.exact.heads import exact_medusa_heads
    from specdec_ref.exact import exact_pair

    target = exact_pair("order1-close").target.load(torch.float32)
    spec = exact_medusa_heads(target, "order1-target", heads=3, sample=True)
    decoder = TreeSpeculativeDecoder()
    prompts_ = [[2, 5], [3], [1, 4, 6], [2, 5]]
    for depth, width in ((2, 2), (3, 2), (3, 3)):
        requests = [Request(prompt=p, max_new_tokens=8 + i, sampling=SETTINGS[i % 3] if i % 3 != 1 else GREEDY,
                            generator=torch.Generator().manual_seed(70 + i)) for i, p in enumerate(prompts_ * 2)]
        lengths = []
        rows = decoder.decode_tree_batch(target, spec, requests, depth=depth, width=width,
                                         on_round=lambda rec, t, d: lengths.append(rec.target_len == d.tentative_length
                                                                                   == rec.committed_len - 1))
        assert all(lengths)
        for i, r in enumerate(requests):
            alone = _alone(decoder, target, spec, r, depth, width, 70 + i)
            assert rows[i].tokens == alone.tokens, (depth, width, i)
