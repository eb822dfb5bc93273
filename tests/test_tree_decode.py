"""Unit tests of the tree decoder (specdec_ref.tree_decode) and the caches' tree feeding / compaction."""
import pytest
import torch

from conformance.decoder_checks import _cache_hook, model_pair, prompts
from specdec_properties.stateful_cache import compare_kv, fresh_prefill
from specdec_ref.backend import ReferenceBackend, reference_backend
from specdec_ref.cache import ModelCache, tree_layout
from specdec_ref.contract import check_backend
from specdec_ref.decode import SpeculativeDecoder, autoregressive_decode
from specdec_ref.models import make_draft, tiny_lm
from specdec_ref.static_cache import StaticModelCache, fastest_cache
from specdec_ref.tree import DeterministicTreeVerifier, RecursiveTreeVerifier, SpecInferTreeVerifier
from specdec_ref.tree_decode import TreeSpeculativeDecoder, tree_nodes
from specdec_ref.warp import GREEDY, SamplingConfig

CACHES = {"static": fastest_cache, "dynamic": ModelCache}
SHAPES = [(1, 1), (4, 1), (1, 3), (2, 2), (3, 3), (5, 2)]  # (depth, width): chains, stars, bushy trees
SAMPLING = SamplingConfig(temperature=0.9, top_k=6)


def _full_tokens_hook(target, draft, prompt, tokens, where):
    return _cache_hook(target, draft, prompt[0].tolist() + tokens, where)


# ----------------------------------------------------------------------------- greedy == AR, caches == prefill


@pytest.mark.parametrize("cache", list(CACHES))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_tree_decoding_equals_ar_and_caches_equal_prefill_every_round(arch, cache):
    """fp32, both cache kinds: every (depth, width) gives AR's tokens, and after every round both caches
    hold exactly the committed tokens but the pending one, K/V equal to a fresh prefill."""
    decoder = TreeSpeculativeDecoder(make_cache=CACHES[cache])
    for family, noise in (("noisy", 0.2), ("independent", 0.0)):
        target, draft = model_pair(arch, family, noise)
        if cache == "static":
            assert isinstance(fastest_cache(target), StaticModelCache)
        for prompt in prompts(7, 2):
            ar = autoregressive_decode(target, prompt, max_new_tokens=20)
            for depth, width in SHAPES:
                where = f"{arch} {cache} {family} depth={depth} width={width}"
                hook = _full_tokens_hook(target, draft, prompt, ar.tokens, where)
                result = decoder.decode(target, draft, prompt, depth=depth, width=width, max_new_tokens=20, on_round=hook)
                assert result.tokens == ar.tokens, where
                assert all(r.target_len == r.draft_len == r.committed_len - 1 for r in result.rounds)


@pytest.mark.parametrize("cache", list(CACHES))
def test_gpt2_trees_on_the_lean_cache_and_through_the_transformers_4d_mask(cache):
    """GPT-2: the lean cache (learned positions gathered at the nodes' depths) and the transformers DynamicCache
    adapter (the tree mask and position ids given to the model) both decode AR's tokens with caches equal to a prefill."""
    target, draft = model_pair("gpt2", "noisy", 0.2)
    assert type(fastest_cache(target)) is StaticModelCache
    decoder = TreeSpeculativeDecoder(make_cache=CACHES[cache])
    for prompt in prompts(8, 2):
        ar = autoregressive_decode(target, prompt, max_new_tokens=16)
        for depth, width in ((3, 2), (2, 3)):
            hook = _full_tokens_hook(target, draft, prompt, ar.tokens, f"gpt2 {cache} depth={depth} width={width}")
            result = decoder.decode(target, draft, prompt, depth=depth, width=width, max_new_tokens=16, on_round=hook)
            assert result.tokens == ar.tokens


@pytest.mark.parametrize("scheme", [SpecInferTreeVerifier, RecursiveTreeVerifier, DeterministicTreeVerifier])
def test_sampled_tree_decoding_keeps_caches_equal_to_prefill_and_is_reproducible(scheme):
    target, draft = model_pair("llama", "noisy", 0.2)
    decoder = TreeSpeculativeDecoder(scheme())
    for prompt in prompts(9, 2):
        eos = int(prompt[0, 0])
        run = dict(depth=3, width=3, max_new_tokens=20, sampling=SAMPLING, eos_id=eos)
        first = decoder.decode(target, draft, prompt, generator=torch.Generator().manual_seed(3), **run)
        hook = _full_tokens_hook(target, draft, prompt, first.tokens, scheme.__name__)
        again = decoder.decode(target, draft, prompt, generator=torch.Generator().manual_seed(3), on_round=hook, **run)
        assert again.tokens == first.tokens
        assert len(first.tokens) <= 20 and (eos not in first.tokens or first.tokens[-1] == eos)


def test_width_one_tree_equals_the_chain_decoder_with_k_equal_depth():
    target, draft = model_pair("llama", "noisy", 0.2)
    for prompt in prompts(10, 3):
        for depth in (1, 2, 4):
            chain = SpeculativeDecoder().decode(target, draft, prompt, k=depth, max_new_tokens=21)
            tree = TreeSpeculativeDecoder().decode(target, draft, prompt, depth=depth, width=1, max_new_tokens=21)
            assert tree.tokens == chain.tokens
            assert [(r.proposed, r.accepted, r.emitted) for r in tree.rounds] == [(r.proposed, r.accepted, r.emitted) for r in chain.rounds]
            assert (tree.target_calls, tree.draft_calls, tree.host_syncs) == (chain.target_calls, chain.draft_calls, chain.host_syncs)


def test_identical_draft_accepts_whole_depth_and_records_count_nodes():
    target, draft = model_pair("llama", "identical")
    prompt = prompts(11, 1)[0]
    result = TreeSpeculativeDecoder().decode(target, draft, prompt, depth=3, width=2, max_new_tokens=12)
    assert result.tokens == autoregressive_decode(target, prompt, max_new_tokens=12).tokens
    assert [r.accepted for r in result.rounds] == [3, 3, 3]
    assert [r.proposed for r in result.rounds] == [tree_nodes(3, 2)] * 3
    assert result.host_syncs == len(result.rounds) and result.target_calls == len(result.rounds) + 1
    # prompt prefill; per round: the pending token + 2 fed levels, + the path's leaf fed after verification
    assert result.draft_calls == 1 + 3 * (3 + 1)


# ----------------------------------------------------------------------------- EOS, max_new_tokens, limits


@pytest.mark.parametrize("depth,width,max_new", [(3, 2, 0), (3, 2, 1), (3, 2, 2), (4, 3, 7), (1, 4, 5), (6, 2, 13)])
def test_max_new_tokens_is_exact(depth, width, max_new):
    target, draft = model_pair("llama", "identical")
    prompt = prompts(12, 1)[0]
    for sampling in (GREEDY, SAMPLING):
        result = TreeSpeculativeDecoder().decode(
            target, draft, prompt, depth=depth, width=width, max_new_tokens=max_new, sampling=sampling,
            generator=torch.Generator().manual_seed(0),
        )
        assert len(result.tokens) == max_new and result.finished_by == "max_new_tokens"
        assert all(r.proposed <= tree_nodes(depth, width) for r in result.rounds)


@pytest.mark.parametrize("j", [0, 1, 2, 4, 9])
@pytest.mark.parametrize("cache", list(CACHES))
def test_eos_anywhere_on_the_path_ends_generation_and_nothing_after_it_is_cached(j, cache):
    target, draft = model_pair("llama", "noisy", 0.05)
    prompt = prompts(13, 1)[0]
    plain = autoregressive_decode(target, prompt, max_new_tokens=16)
    eos = plain.tokens[j]
    expected = plain.tokens[: plain.tokens.index(eos) + 1]
    for depth, width in ((4, 2), (2, 3), (1, 2)):
        hook = _full_tokens_hook(target, draft, prompt, expected, f"eos={eos}")
        result = TreeSpeculativeDecoder(make_cache=CACHES[cache]).decode(
            target, draft, prompt, depth=depth, width=width, max_new_tokens=16, eos_id=eos, on_round=hook
        )
        assert result.tokens == expected and result.finished_by == "eos"
        last = result.rounds[-1]
        assert last.committed_len == prompt.shape[1] + len(expected) == last.target_len + 1 == last.draft_len + 1


def test_trees_shrink_near_the_position_limit():
    """Near max_positions the tree gets fewer levels (then fewer children) so its slots fit; output stays AR's."""
    target = tiny_lm("llama", vocab_size=16, seed=21, init_scale=2.0, max_positions=24)
    draft = make_draft(target, "noisy", noise=0.1, seed=22)
    prompt = prompts(14, 1)[0]
    for cache in CACHES.values():
        ar = autoregressive_decode(target, prompt, max_new_tokens=19)
        hook = _full_tokens_hook(target, draft, prompt, ar.tokens, "near the limit")
        result = TreeSpeculativeDecoder(make_cache=cache).decode(target, draft, prompt, depth=4, width=3, max_new_tokens=19, on_round=hook)
        assert result.tokens == ar.tokens
        assert all(r.start + r.proposed <= 24 for r in result.rounds)
        assert any(0 < r.proposed < tree_nodes(4, 3) for r in result.rounds[:-1])


@pytest.mark.parametrize(
    "override,match",
    [
        ({"depth": 0}, "depth"), ({"width": 0}, "width"), ({"depth": True}, "depth"), ({"width": 2.0}, "width"),
        ({"width": 17}, "width"), ({"max_new_tokens": -1}, "max_new_tokens"), ({"eos_id": 16}, "eos_id"),
        ({"sampling": None}, "sampling"),
    ],
)
def test_bad_input_raises(override, match):
    target, draft = model_pair("llama", "identical")
    run = {"depth": 2, "width": 2, "max_new_tokens": 4, "sampling": GREEDY, **override}
    with pytest.raises((ValueError, TypeError), match=match):
        TreeSpeculativeDecoder().decode(target, draft, torch.tensor([[1, 2]]), **run)


def test_bad_prompt_and_vocab_mismatch_raise():
    target, draft = model_pair("llama", "identical")
    other = tiny_lm("llama", vocab_size=12, seed=3)
    with pytest.raises(ValueError):
        TreeSpeculativeDecoder().decode(target, draft, torch.zeros(1, 0, dtype=torch.long), depth=2, width=2, max_new_tokens=3)
    with pytest.raises(ValueError):
        TreeSpeculativeDecoder().decode(target, draft, torch.tensor([[1, 99]]), depth=2, width=2, max_new_tokens=3)
    with pytest.raises(ValueError, match="vocabulary"):
        TreeSpeculativeDecoder().decode(target, other, torch.tensor([[1, 2]]), depth=2, width=2, max_new_tokens=3)


# ----------------------------------------------------------------------------- drafting steps


def test_children_follow_the_tree_scheme():
    probs = torch.tensor([[0.1, 0.3, 0.3, 0.0, 0.3], [0.5, 0.5, 0.0, 0.0, 0.0]])
    top = TreeSpeculativeDecoder(DeterministicTreeVerifier()).children(probs, 3, SAMPLING, None)
    assert top.tolist() == [[1, 2, 4], [0, 1, 2]]  # stable: ties to the lower id
    assert TreeSpeculativeDecoder().children(probs, 3, GREEDY, None).tolist() == top.tolist()  # greedy drafts the top w
    g = torch.Generator().manual_seed(0)
    recursive = TreeSpeculativeDecoder(RecursiveTreeVerifier())
    for _ in range(50):
        kids = recursive.children(probs, 4, SAMPLING, g)
        assert len(set(kids[0, :3].tolist())) == 3 and set(kids[0].tolist()) <= {0, 1, 2, 4}
        # support of row 1 is {0, 1}: drawn without replacement, then i.i.d. duplicates of q (never a zero-q token)
        assert sorted(kids[1, :2].tolist()) == [0, 1] and set(kids[1, 2:].tolist()) <= {0, 1}
    iid = TreeSpeculativeDecoder().children(probs[:1].expand(2000, -1), 2, SAMPLING, g)
    freq = torch.bincount(iid.reshape(-1), minlength=5).float() / iid.numel()
    assert torch.allclose(freq, probs[0], atol=0.03)


def test_expand_picks_highest_cumulative_probability_ties_to_lower_index():
    decoder = TreeSpeculativeDecoder()
    assert decoder.expand(torch.tensor([0.1, 0.4, 0.2, 0.4, 0.05]), 3).tolist() == [1, 2, 3]
    assert decoder.expand(torch.tensor([0.2, 0.2, 0.2, 0.2]), 2).tolist() == [0, 1]


def test_draft_tree_is_bfs_with_parent_rows():
    target, draft = model_pair("llama", "noisy", 0.2)
    decoder = TreeSpeculativeDecoder()
    cache = fastest_cache(draft)
    prompt = prompts(15, 1)[0]
    cache.feed(prompt[:, :-1])
    cache.commit(prompt.shape[1] - 1)
    tree = decoder.grow(cache, prompt[:, -1:], 3, 2, GREEDY, None)
    parents = tree.parents.tolist()
    assert tree.size == tree_nodes(3, 2) == len(parents) == 10
    assert parents[:2] == [-1, -1] and parents[2:6] == [0, 0, 1, 1]
    assert all(p < i for i, p in enumerate(parents)) and parents[6:] == sorted(parents[6:])
    # siblings share their parent's row (draft_probs); greedy children are that row's top-2
    for i in range(0, 10, 2):
        row = tree.draft_probs[i]
        assert torch.equal(tree.draft_probs[i + 1], row)
        assert sorted(tree.tokens[i : i + 2].tolist()) == sorted(torch.sort(row, descending=True, stable=True).indices[:2].tolist())
    slots = tree.draft_slots.tolist()
    assert slots[:2] == [prompt.shape[1], prompt.shape[1] + 1] and slots[6:] == [-1] * 4  # last level never fed
    assert sum(s >= 0 for s in slots[2:6]) == 2 and cache.tentative_length == prompt.shape[1] + 4


# ----------------------------------------------------------------------------- caches: feed_tree / compact


def _path(tokens, parents, j):
    out = []
    while j >= 0:
        out.append(tokens[j])
        j = parents[j]
    return out[::-1]


CACHE_KINDS = [("llama", StaticModelCache), ("qwen2", StaticModelCache), ("gpt2", StaticModelCache), ("llama", ModelCache),
               ("qwen2", ModelCache), ("gpt2", ModelCache)]


@pytest.mark.parametrize("arch,cls", CACHE_KINDS, ids=[f"{a}-{c.__name__}" for a, c in CACHE_KINDS])
def test_feed_tree_and_compact_equal_a_fresh_prefill(arch, cls):
    """Every node's logits equal a fresh prefill of prefix + its path; compacting to a path that is not a dense
    prefix of the node order leaves exactly a fresh prefill of prefix + path; a tree fed over several calls too."""
    model = tiny_lm(arch, vocab_size=16, seed=31, init_scale=2.0)
    cache = cls(model)
    prefix = [3, 1, 4, 1, 5]
    cache.feed(torch.tensor([prefix]))
    cache.commit(len(prefix))
    tokens = [9, 2, 6, 5, 3, 5, 8, 9]
    parents = [-1, 0, 0, 1, 2, 2, 4, 1]
    logits = cache.feed_tree(torch.tensor([tokens]), parents)
    assert cache.tentative_length == len(prefix) + len(tokens) and cache.committed_length == len(prefix)
    for j in range(len(tokens)):
        expected, _ = fresh_prefill(model, prefix + _path(tokens, parents, j))
        assert torch.allclose(logits[0, j], expected[0, -1], atol=1e-5, rtol=1e-4), j
    cache.compact([5 + i for i in (0, 2, 4, 6)])  # the path 0 -> 2 -> 4 -> 6: slots 5, 7, 9, 11
    kept = prefix + _path(tokens, parents, 6)
    assert cache.tentative_length == len(kept) and cache.committed_length == len(prefix)
    compare_kv(cache.layer_kv(), fresh_prefill(model, kept)[1])
    # the next feed sees exactly the compacted sequence
    cache.commit(len(kept))
    expected, _ = fresh_prefill(model, kept + [7])
    assert torch.allclose(cache.feed(torch.tensor([[7]]))[0, -1], expected[0, -1], atol=1e-5, rtol=1e-4)
    # a tree fed one level per call (as the draft does), hanging under the prefix + [7]
    base = kept + [7]
    cache.commit(len(base))
    start = cache.tentative_length
    first = cache.feed_tree(torch.tensor([[4, 10]]), [-1, -1])
    second = cache.feed_tree(torch.tensor([[11, 12, 13]]), [-1, -1, 1, 0, 1], tree_start=start)
    for row, path in ((first[0, 1], [10]), (second[0, 0], [10, 11]), (second[0, 1], [4, 12]), (second[0, 2], [10, 13])):
        expected, _ = fresh_prefill(model, base + path)
        assert torch.allclose(row, expected[0, -1], atol=1e-5, rtol=1e-4), path
    cache.compact([start + 1, start + 4])
    compare_kv(cache.layer_kv(), fresh_prefill(model, base + [10, 13])[1])


@pytest.mark.parametrize("cls", [StaticModelCache, ModelCache])
def test_a_chain_tree_is_a_plain_feed_and_dense_compaction_is_a_trim(cls):
    model = tiny_lm("llama", vocab_size=16, seed=32)
    a, b = cls(model), cls(model)
    for cache in (a, b):
        cache.feed(torch.tensor([[1, 2, 3]]))
        cache.commit(3)
    la = a.feed(torch.tensor([[4, 5, 6]]))
    lb = b.feed_tree(torch.tensor([[4, 5, 6]]), [-1, 0, 1])
    assert torch.allclose(la, lb, atol=1e-5, rtol=1e-4)
    b.compact([3, 4])
    a.trim(5)
    assert (b.tentative_length, b.committed_length) == (5, 3)
    compare_kv(b.layer_kv(), a.layer_kv())
    b.compact([])
    assert b.tentative_length == 3
    b.trim(0)
    b.feed_tree(torch.tensor([[1, 2, 3]]), [-1, -1, 0])
    b.compact([])
    assert b.tentative_length == 0  # nothing committed: compact([]) empties it


def test_feed_tree_and_compact_reject_bad_arguments():
    model = tiny_lm("llama", vocab_size=16, seed=33)
    cache = ModelCache(model)
    cache.feed(torch.tensor([[1, 2]]))
    cache.commit(2)
    cache.feed(torch.tensor([[3]]))
    with pytest.raises(ValueError, match="parents"):
        cache.feed_tree(torch.tensor([[1, 2]]), [-1, 1])  # not topological
    with pytest.raises(ValueError, match="parents"):
        cache.feed_tree(torch.tensor([[1, 2]]), [-1])  # one entry per node
    with pytest.raises(ValueError, match="tree_start"):
        cache.feed_tree(torch.tensor([[1]]), [-1], tree_start=4)
    with pytest.raises(ValueError, match="vocab|range|\\[0"):
        cache.feed_tree(torch.tensor([[1, 99]]), [-1, 0])
    with pytest.raises(ValueError, match="strictly increasing"):
        cache.compact([1])  # below committed
    with pytest.raises(ValueError, match="strictly increasing"):
        cache.compact([2, 2])
    with pytest.raises(ValueError, match="strictly increasing"):
        cache.compact([3])  # past tentative
    with pytest.raises(TypeError):
        cache.compact(torch.tensor([2]))
    assert cache.tentative_length == 3 and cache.committed_length == 2


def test_tree_layout_depths_and_ancestors():
    parents = torch.tensor([-1, 0, 0, 1, 2, 2, 4, 1, -1])
    depth, anc = tree_layout(parents)
    assert depth.tolist() == [0, 1, 1, 2, 2, 2, 3, 2, 0]
    assert anc[6].nonzero().reshape(-1).tolist() == [0, 2, 4, 6]
    assert anc[8].nonzero().reshape(-1).tolist() == [8]
    chain = tree_layout(torch.arange(40) - 1)
    assert chain[0].tolist() == list(range(40)) and torch.equal(chain[1], torch.ones(40, 40, dtype=torch.bool).tril())


# ----------------------------------------------------------------------------- backend


def test_reference_backend_claims_and_delegates_decode_tree():
    backend = reference_backend()
    check_backend(backend)
    assert backend.capabilities.tree_decoder
    target, draft = model_pair("qwen2", "noisy", 0.05)
    prompt = prompts(16, 1)[0]
    out = backend.decode_tree(target, draft, prompt, depth=3, width=2, max_new_tokens=10, sampling=GREEDY)
    assert out.tokens == autoregressive_decode(target, prompt, max_new_tokens=10).tokens
    custom = TreeSpeculativeDecoder(DeterministicTreeVerifier())
    assert ReferenceBackend(tree_decoder=custom).tree_decoder is custom
    assert ReferenceBackend(tree_verifier=RecursiveTreeVerifier()).tree_decoder.tree_scheme == "recursive"


def test_tree_decoder_benchmark_rows(capsys):
    from specdec_bench.tree_decoder import SUBCOMMAND, shape_list

    import argparse

    parser = argparse.ArgumentParser()
    SUBCOMMAND.add_arguments(parser)
    args = parser.parse_args(
        ["--prompts", "1", "--new-tokens", "12", "--repeats", "1", "--k", "2", "--shapes", "2x2,3x1", "--variants", "ar-lean,chain,tree"]
    )
    assert shape_list("4x2, 3X3") == [(4, 2), (3, 3)]
    threads = torch.get_num_threads()
    rows = SUBCOMMAND.run(args)
    assert torch.get_num_threads() == threads
    assert [r["label"] for r in rows] == ["ar-lean", "chain k=2", "tree 2x2", "tree 3x1"] * 2
    greedy = [r for r in rows if r["mode"] == "greedy"]
    assert all(r["equals_ar"] for r in greedy[1:]) and greedy[0]["equals_ar_text"] == "ref"
    tree = next(r for r in greedy if r["label"] == "tree 2x2")
    assert tree["tokens_per_target_call"] > 1 and tree["nodes_per_round"] > 0 and tree["accepted_per_round"] >= 0
    lines = SUBCOMMAND.summarise(args, rows)
    assert any(line.startswith("greedy: best tree") for line in lines)


@pytest.mark.parametrize("case, stated", [("cold", (0.056, 0.507, 160)), ("hot", (1.160, 1.007, -8)), ("min_p", (1.287, 1.085, -10))])
def test_the_stated_tree_efficiency_shifts_are_exact(case, stated):
    """tree_decoder_acceptance_under_filters' docstring: ideal vs filters-before-temperature children on SpecInfer trees
    (width 2, depth 2), exact mean accepted per round along the decodes (the warped target chain's occupancy over 64
    tokens from a uniform start) and the shift in standard errors of a total over the rounds of 60 decodes."""
    import math

    import numpy as np

    from conformance.decoder_checks import EFFICIENCY_NEW_TOKENS, EFFICIENCY_PAIR, FILTERED_EFFICIENCY
    from conformance.tree_decoder_checks import TREE_EFFICIENCY_DECODES, TREE_EFFICIENCY_DEPTH, TREE_EFFICIENCY_WIDTH
    from specdec_properties.markov import MarkovPair
    from specdec_properties.tree_exact import kary, tree_accepted_moments
    from specdec_ref.exact import exact_pair
    from specdec_ref.warp import min_p_filter, scale_temperature, top_k_filter, top_p_filter, warp

    cfg, _ = FILTERED_EFFICIENCY[case]
    pair = exact_pair(EFFICIENCY_PAIR)
    contexts = [[a] for a in range(pair.target.vocab)]
    zt, zd = pair.target.next_logits(contexts), pair.draft.next_logits(contexts)
    x = min_p_filter(top_p_filter(top_k_filter(zd.double(), cfg.top_k), cfg.top_p), cfg.min_p)
    moved_q = torch.softmax(scale_temperature(x, cfg.temperature), -1).numpy()
    p = warp(zt, cfg, dtype=torch.float64).numpy()
    shape = kary(TREE_EFFICIENCY_WIDTH, TREE_EFFICIENCY_DEPTH)
    ideal, var = tree_accepted_moments("specinfer", shape, MarkovPair("ideal", p, warp(zd, cfg, dtype=torch.float64).numpy(), 0, ""))
    moved, _ = tree_accepted_moments("specinfer", shape, MarkovPair("moved", p, moved_q, 0, ""))
    at, w = np.full(p.shape[0], 1.0 / p.shape[0]), np.zeros(p.shape[0])
    for _ in range(EFFICIENCY_NEW_TOKENS):
        w += at
        at = at @ p
    w /= w.sum()
    a0, a1 = float(w @ ideal), float(w @ moved)
    rounds = TREE_EFFICIENCY_DECODES * EFFICIENCY_NEW_TOKENS / (1 + a0)
    z = (a1 - a0) / math.sqrt(float(w @ var) / rounds)
    assert (round(a0, 3), round(a1, 3), round(z)) == stated


def test_the_tree_law_check_lets_the_tree_filter_order_mutant_through():
    """Drawing children filtered before the temperature (q honest) is exact: tree_decoder_sequence_law passes it (dev
    scale); only the acceptance check sees it."""
    from conformance.registry import CheckContext, all_cases, run_case
    from specdec_fixtures.mutants import MUTANTS

    mutant = MUTANTS["tree_draft_filters_before_temperature"].backend()
    for case in all_cases(["tree_decoder_sequence_law"]):
        record = run_case(case, mutant, CheckContext(profile="dev"))
        assert record.status == "passed", (case.id, record.message[:1500])


def test_the_stated_tree_position_limit_shift_is_exact():
    """TREE_SEQUENCE_CASES' position_limit: on the reference every 3-token continuation ends with a plain target step
    (a round proposing no node), so a plain step taking the argmax gives exactly the law below (the AR law with the
    third token moved to the target row's argmax), at TV 0.134; the mutant's decodes fit that law."""
    import collections

    from conformance.decoder_checks import SEQUENCE_CASES, sequence_eos, sequence_law, sequence_models
    from conformance.tree_decoder_checks import LAW_WIDTH, TREE_SEQUENCE_CASES
    from specdec_fixtures.mutants.tree_decoder import TreeGreedyFallbackAtPositionLimit
    from specdec_properties.stats import ALPHA, goodness_of_fit

    case = "position_limit"
    spec, eos = SEQUENCE_CASES[case], sequence_eos(case)
    target, draft = sequence_models(spec.pair)
    prompt = torch.tensor([list(spec.prompt)])
    run = dict(depth=spec.k, width=LAW_WIDTH, max_new_tokens=spec.length, sampling=spec.sampling, eos_id=eos)
    gen = torch.Generator().manual_seed(5)
    for _ in range(200):
        result = TreeSpeculativeDecoder().decode(target, draft, prompt, generator=gen, **run)
        assert result.rounds[0].proposed == LAW_WIDTH  # one level of two nodes: the tree shrunk at the limit
        if len(result.tokens) == spec.length:
            assert result.rounds[-1].proposed == 0, result.rounds
    law = dict(sequence_law(case))
    moved: dict = collections.defaultdict(float)
    for seq, p in law.items():
        if len(seq) == spec.length:
            with torch.no_grad():
                row = target(torch.cat([prompt, torch.tensor([list(seq[:-1])])], 1)).logits[0, -1]
            seq = seq[:-1] + (int(row.argmax()),)
        moved[seq] += p
    shift = 0.5 * sum(abs(law.get(s, 0.0) - moved.get(s, 0.0)) for s in set(law) | set(moved))
    assert round(shift, 3) == 0.134 and shift > TREE_SEQUENCE_CASES[case]
    mutant = TreeGreedyFallbackAtPositionLimit()
    outputs = [tuple(mutant.decode(target, draft, prompt, generator=gen, **run).tokens) for _ in range(600)]
    counts = collections.Counter(outputs)
    assert set(counts) <= {s for s, p in moved.items() if p > 0}, counts
    keys = sorted(set(law) | set(moved))
    observed = [counts.get(key, 0) for key in keys]
    fit = goodness_of_fit(observed, [moved.get(key, 0.0) for key in keys], what="the mutant's continuations vs the moved law",
                          labels=[str(key) for key in keys])
    assert fit.p_value > ALPHA, fit
    unmoved = goodness_of_fit(observed, [law.get(key, 0.0) for key in keys], what="the mutant's continuations vs the AR law",
                              labels=[str(key) for key in keys])
    assert unmoved.p_value < ALPHA, unmoved  # the same 600 decodes tell the two laws apart


def test_the_older_tree_case_lets_the_tree_position_limit_mutant_through():
    """The position case ends far below the models' maximum positions: a wrong plain target step passes it (dev scale);
    only the position_limit case sees it (tests/test_mutants.py)."""
    from conformance.registry import CheckContext, all_cases, run_case
    from specdec_fixtures.mutants import MUTANTS

    mutant = MUTANTS["tree_greedy_fallback_at_position_limit"].backend()
    (case,) = [c for c in all_cases(["tree_decoder_sequence_law"]) if c.case_id == "position"]
    record = run_case(case, mutant, CheckContext(profile="dev"))
    assert record.status == "passed", record.message[:1500]


def test_the_position_limit_check_reaches_every_kind_of_shrunk_round():
    """tree_decoder_position_limit's premise: on the reference its decodes have rounds with fewer levels than asked,
    rounds with fewer children than the width, and rounds with no tree (a plain target step)."""
    from conformance.tree_decoder_checks import LIMIT_DISTANCES, LIMIT_POSITIONS, LIMIT_TREES, limit_pair

    target, draft = limit_pair()
    g = torch.Generator().manual_seed(3)
    kinds = set()
    for j in range(1, LIMIT_DISTANCES + 1):
        prompt = torch.randint(0, 16, (1, LIMIT_POSITIONS - j), generator=g)
        for depth, width in LIMIT_TREES:
            result = TreeSpeculativeDecoder().decode(target, draft, prompt, depth=depth, width=width, max_new_tokens=j + 1)
            assert result.tokens == autoregressive_decode(target, prompt, max_new_tokens=j + 1).tokens
            for r in result.rounds:
                assert r.start + r.proposed <= LIMIT_POSITIONS
                full_levels = [tree_nodes(d, width) for d in range(1, depth + 1)]
                if r.proposed == 0:
                    kinds.add("no tree")
                elif r.proposed in full_levels[:-1]:
                    kinds.add("fewer levels")
                elif r.proposed not in full_levels:
                    kinds.add("fewer children")
    assert kinds == {"no tree", "fewer levels", "fewer children"}, kinds
