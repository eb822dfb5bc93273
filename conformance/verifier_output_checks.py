"""Conformance checks of the block verifier's outputs themselves (``backend.verify``), beyond the per-block laws.

Output structure, greedy paths, deterministic edge cases (``p == q``, one-hot targets, drafts of target
probability 0), seeds and the global RNG, and per-row generators. Same family as :mod:`conformance.verifier_checks`
(the exact laws, and the scenario helpers used here): both run in ``conformance/test_verifier.py``, these checks
registering after the laws.

Every check calls ``verify`` through :func:`specdec_properties.sampling.verify_rows` (``_call``), so a backend that does
not claim ``batched`` gets one B = 1 call per row, with inputs on ``ctx.device`` (``--specdec-device``) and
generators made there (:func:`specdec_properties.sampling.device_generator`); outputs come back to the CPU.
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from specdec_properties import exact
from specdec_properties.sample_size import MIXED_BATCH_TV, required_samples, scaled_blocks, with_margin
from specdec_properties.sampling import device_generator, draw_drafts, emits_bonus, verify_rows
from specdec_properties.scenarios import STAT_SCENARIOS
from specdec_properties.stats import assert_fits
from specdec_properties.strategies import Block, draft_rows_for, greedy_blocks, greedy_maximisers, probability_rows, sampling_blocks, seeds

from .registry import CheckContext, NotApplicable, check
from .verifier_checks import BATCH_FILLER, _length_labels, _token_labels, declared_scheme

#: The test file these checks run in (``conformance/test_verifier.py``), as for ``verifier_checks``.
FAMILY = "verifier"


# ----------------------------------------------------------------------------- deterministic


def _call(backend, block: Block, generator=None, where: str = "", *, device=None):
    """``verify`` on the block (one B = 1 call per row for a non-batched backend) with its tensors on ``device``
    (the generator must live there), output structure-checked and back on the CPU."""
    __tracebackhide__ = True
    return verify_rows(
        backend, block.draft_tokens, block.draft_probs, block.target_probs,
        generator=generator, where=where or block.describe(), vocab=block.vocab, device=device,
    )


@check(
    guards="non-contiguous acceptance, missing bonus/replacement, wrong padding, ids out of range, wrong shapes or dtypes",
    requires=("verifier", "sampling"),
)
def check_structure_sampling(backend, ctx: CheckContext):
    """Sampling output: 0 <= m <= k, tokens[:m] are the drafts, tokens[m] in [0, V), -1 after."""

    @given(block=sampling_blocks(), seed=seeds)
    def structure(block, seed):
        note(block.describe())
        _call(backend, block, device_generator(seed, ctx.device), device=ctx.device)

    structure()


@check(
    guards="non-contiguous acceptance, missing bonus/replacement, wrong padding, ids out of range, wrong shapes or dtypes",
    requires=("verifier", "greedy"),
)
def check_structure_greedy(backend, ctx: CheckContext):
    """Greedy output: 0 <= m <= k, tokens[:m] are the drafts, tokens[m] in [0, V), -1 after."""

    @given(block=greedy_blocks())
    def structure(block):
        note(block.describe())
        _call(backend, block, device=ctx.device)

    structure()


@check(
    guards="greedy compared against the wrong row, acceptance past a mismatch, wrong replacement or bonus",
    requires=("verifier", "greedy"),
)
def check_greedy_valid_path(backend, ctx: CheckContext):
    """Greedy output is a valid greedy path for Hypothesis blocks with forced stops and exact ties.

    Every accepted draft and the emitted token are maximisers of their rows, and
    a stop before k emits a token different from the rejected draft. With no
    ties this is exactly ``argmax`` decoding.
    """

    @given(block=greedy_blocks())
    def valid_path(block):
        note(block.describe())
        m, tokens = _call(backend, block, device=ctx.device)
        rows = block.target_probs.numpy()
        drafts = block.draft_tokens.numpy()
        for b in range(drafts.shape[0]):
            mb = int(m[b])
            for i in range(mb):
                best = greedy_maximisers(rows[b, i])
                assert drafts[b, i] in best, (
                    f"row {b}: draft d_{i + 1} = {drafts[b, i]} was accepted but the maximisers of target row {i} "
                    f"are {best.tolist()} (p[d] = {rows[b, i, drafts[b, i]]:.6g}, max = {rows[b, i].max():.6g})"
                )
            if mb == block.k and not emits_bonus(backend):
                continue  # no-bonus variant: nothing emitted after k accepted drafts (structure-checked)
            best = greedy_maximisers(rows[b, mb])
            emitted = int(tokens[b, mb])
            what = "bonus" if mb == block.k else "replacement"
            assert emitted in best, (
                f"row {b}: the {what} at position {mb} is {emitted} but the maximisers of target row {mb} are "
                f"{best.tolist()}; pattern {block.pattern}"
            )
            if mb < block.k:
                assert emitted != drafts[b, mb], (
                    f"row {b}: stopped at m={mb} although draft d_{mb + 1} = {drafts[b, mb]} is the emitted greedy "
                    f"choice of row {mb}: a matching draft must be accepted"
                )

    valid_path()


@check(guards="rejections when p == q (acceptance must be 1), e.g. u <= p/q with u in (0, 1] or a ratio computed in low precision", requires=("verifier", "sampling"))
def check_sampling_p_equals_q_accepts_all(backend, ctx: CheckContext):
    """With draft rows equal to the target rows every drafted token is accepted and the bonus comes from row k
    (schemes ``token`` and ``block``; a one-hot-draft or lossy scheme rejects some drafts by design)."""
    scheme = getattr(getattr(backend, "capabilities", None), "scheme", "token")
    if scheme not in ("token", "block"):
        raise NotApplicable(f"scheme {scheme!r} does not accept every draft when p == q")
    bonus_emitted = emits_bonus(backend)

    @given(vocab=st.integers(2, 48), k=st.integers(1, 8), data=st.data(), seed=seeds)
    def accepts_all(vocab, k, data, seed):
        target = data.draw(probability_rows(vocab, k + 1), label="target rows")
        batch = 256
        gen = torch.Generator().manual_seed(seed)
        q = torch.tensor(target[:k], dtype=torch.float32)
        block = Block(
            draft_tokens=draw_drafts(q, batch, gen),
            draft_probs=q.expand(batch, -1, -1),
            target_probs=torch.tensor(target, dtype=torch.float32).expand(batch, -1, -1),
            pattern="p == q",
        )
        m, tokens = _call(backend, block, device_generator(seed, ctx.device, cpu=gen), device=ctx.device)
        rejected = (m < k).nonzero()
        assert len(rejected) == 0, (
            f"p == q but row {int(rejected[0])} stopped at m={int(m[rejected[0]])} < k={k} "
            f"(drafts {block.draft_tokens[rejected[0]].tolist()})"
        )
        if bonus_emitted:
            bonus = tokens[:, k]
            assert (torch.tensor(target[k])[bonus] > 0).all(), "a bonus token has zero probability under row k"

    accepts_all()


@check(guards="acceptance or replacement ignoring the target (e.g. replacement from q, argmax of the wrong row)", requires=("verifier", "sampling"))
def check_sampling_one_hot_target_is_deterministic(backend, ctx: CheckContext):
    """With one-hot target rows the output is fully determined: accept d_i iff it is the hot token, then emit the hot token."""

    @given(block=sampling_blocks(), seed=seeds)
    def deterministic(block, seed):
        hot = block.target_probs.argmax(-1)
        one_hot = torch.nn.functional.one_hot(hot, block.vocab).float()
        block = Block(block.draft_tokens, block.draft_probs, one_hot, block.pattern + " (one-hot target)")
        note(block.describe())
        m, tokens = _call(backend, block, device_generator(seed, ctx.device), device=ctx.device)
        expected_m = (block.draft_tokens == hot[:, : block.k]).long().cumprod(1).sum(1)
        bonus_emitted = emits_bonus(backend)
        for b in range(len(m)):
            assert int(m[b]) == int(expected_m[b]), (
                f"row {b}: one-hot target {hot[b].tolist()}, drafts {block.draft_tokens[b].tolist()}: "
                f"expected m={int(expected_m[b])}, got m={int(m[b])}"
            )
            if int(m[b]) == block.k and not bonus_emitted:
                continue
            assert int(tokens[b, m[b]]) == int(hot[b, m[b]]), (
                f"row {b}: after m={int(m[b])} the emitted token must be the hot token {int(hot[b, m[b]])}, got {int(tokens[b, m[b]])}"
            )

    deterministic()


@check(guards="accepting a drafted token the target gives probability 0 (division guards, p/q with q=0)", requires=("verifier", "sampling"))
def check_sampling_zero_target_prob_rejected(backend, ctx: CheckContext):
    """A drafted token with p = 0 at its row is always rejected, so m never passes it."""

    @given(data=st.data(), vocab=st.integers(2, 48), k=st.integers(1, 8), seed=seeds)
    def rejected(data, vocab, k, seed):
        target = data.draw(probability_rows(vocab, k + 1, kinds=("sparse", "one_hot", "tiny_masses")), label="target rows")
        rng = np.random.default_rng(seed)
        q = draft_rows_for("disjoint_zeros", target[:k], rng)
        batch = 64
        gen = torch.Generator().manual_seed(seed)
        qt = torch.tensor(q, dtype=torch.float32)
        block = Block(draw_drafts(qt, batch, gen), qt.expand(batch, -1, -1), torch.tensor(target, dtype=torch.float32).expand(batch, -1, -1), "p=0 drafts")
        m, _ = _call(backend, block, device_generator(seed, ctx.device, cpu=gen), device=ctx.device)
        p_d = block.target_probs.gather(2, block.draft_tokens[..., None].long())[..., 0][:, :k]
        zero = (p_d == 0).long()
        first_zero = torch.cat([zero, torch.ones(batch, 1, dtype=torch.long)], 1).argmax(1)
        over = (m > first_zero).nonzero()
        assert len(over) == 0, (
            f"row {int(over[0])}: draft d_{int(first_zero[over[0]]) + 1} = {int(block.draft_tokens[over[0], first_zero[over[0]]])} "
            f"has target probability 0 at row {int(first_zero[over[0]])} but was accepted (m={int(m[over[0]])})"
        )

    rejected()


def _seeded_run(backend, seed: int, device, batch: int = 4096):
    sc = STAT_SCENARIOS["balanced"]
    draft = torch.tensor(sc.draft, dtype=torch.float32)
    drafts = draw_drafts(draft, batch, torch.Generator().manual_seed(12345))
    block = Block(drafts, draft.expand(batch, -1, -1), torch.tensor(sc.target, dtype=torch.float32).expand(batch, -1, -1), "seeded")
    return _call(backend, block, device_generator(seed, device), where=f"balanced scenario, generator seed {seed}", device=device)


@check(guards="seeds ignored: results that differ for the same generator seed, or do not change with it", requires=("verifier", "sampling"))
def check_sampling_seeded_reproducible(backend, ctx: CheckContext):
    """The same generator seed gives bit-identical results; another seed gives different ones."""
    seed = ctx.seed_for("seeded")
    m1, t1 = _seeded_run(backend, seed, ctx.device)
    m2, t2 = _seeded_run(backend, seed, ctx.device)
    diff = (t1 != t2).any(1).nonzero()
    assert len(diff) == 0, (
        f"generator seed {seed} gave different results in row {int(diff[0])}: {t1[diff[0]].tolist()} vs {t2[diff[0]].tolist()}"
    )
    m3, t3 = _seeded_run(backend, seed + 1, ctx.device)
    assert not torch.equal(t1, t3), f"generator seeds {seed} and {seed + 1} gave identical results on 4096 blocks: is the generator used?"


@check(guards="randomness drawn from the global RNG instead of the given generator", requires=("verifier", "sampling"))
def check_sampling_ignores_global_rng(backend, ctx: CheckContext):
    """With a generator given, the global torch RNG state does not change the result."""
    seed = ctx.seed_for("global")
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(1)
        _, t1 = _seeded_run(backend, seed, ctx.device)
        torch.manual_seed(2)
        _, t2 = _seeded_run(backend, seed, ctx.device)
    finally:
        torch.random.set_rng_state(state)
    diff = (t1 != t2).any(1).nonzero()
    assert len(diff) == 0, (
        f"same generator seed {seed}, different global seeds (1 vs 2): row {int(diff[0])} gave "
        f"{t1[diff[0]].tolist()} vs {t2[diff[0]].tolist()}"
    )


# ----------------------------------------------------------------------------- per-row generators
#
# Engines decode many requests at once, each with its own seed or none. A backend claiming
# ``row_generators`` takes one generator per row (``None``: an unseeded row, the global RNG).


def _mixed_block(rows: int, seed: int) -> Block:
    """Even rows: the batch-filler scenario (they get seeds); odd rows: the balanced scenario (unseeded)."""
    gen = torch.Generator().manual_seed(seed)
    parts = []
    for sc in (BATCH_FILLER, STAT_SCENARIOS["balanced"]):
        q = torch.tensor(sc.draft, dtype=torch.float32)
        parts.append((draw_drafts(q, rows // 2, gen), q.expand(rows // 2, -1, -1), torch.tensor(sc.target, dtype=torch.float32).expand(rows // 2, -1, -1)))

    def interleave(a, b):
        return torch.stack([a, b], 1).reshape(rows, *a.shape[1:])

    return Block(*(interleave(a, b) for a, b in zip(*parts)), pattern="seeded filler rows (even) / unseeded balanced rows (odd)")


def _row_seeds(rows: int, base: int) -> list[int | None]:
    return [base + b if b % 2 == 0 else None for b in range(rows)]


def _run_with_global_seed(backend, block: Block, seeds: list[int | None], global_seed: int, where: str, device):
    """``verify`` with one generator per row (a fresh one per seed on ``device``, None for unseeded) under a given global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(global_seed)
        gens = [None if s is None else device_generator(s, device) for s in seeds]
        return _call(backend, block, gens, where=where, device=device)


@check(
    guards="per-request seeds ignored (one stream for the whole batch, TensorRT-LLM PR 17599), a seeded row's output "
    "depending on its neighbours or its position, rows regrouped by seeded/unseeded and written back in the wrong order "
    "(vLLM issue 9441), unseeded rows all given one default seed",
    requires=("verifier", "sampling", "batched", "row_generators"),
)
def check_sampling_row_generators_reproduce_alone(backend, ctx: CheckContext):
    """With one generator per row in a batch mixing seeded and unseeded rows, every seeded row's output is
    bit-identical to verifying it alone with its own generator, and in a permuted batch with other neighbours and
    another global RNG state; unseeded rows with identical inputs are not copies of each other."""
    rows = 256
    block = _mixed_block(rows, ctx.seed_for("row-generators-block"))
    seeds = _row_seeds(rows, ctx.seed_for("row-generators"))
    _, t1 = _run_with_global_seed(backend, block, seeds, 1, "mixed batch, global seed 1", ctx.device)
    for b in range(0, 32, 2):
        one = Block(block.draft_tokens[b : b + 1], block.draft_probs[b : b + 1], block.target_probs[b : b + 1], "alone")
        _, alone = _call(backend, one, [device_generator(seeds[b], ctx.device)], where=f"row {b} alone, seed {seeds[b]}", device=ctx.device)
        assert torch.equal(alone[0], t1[b]), (
            f"row {b} (generator seed {seeds[b]}) gave {t1[b].tolist()} in the mixed batch but {alone[0].tolist()} verified "
            "alone with the same generator: a seeded row's output must depend only on its inputs and its own generator"
        )
    perm = torch.arange(rows).flip(0)
    other = _mixed_block(rows, ctx.seed_for("row-generators-neighbours"))
    shuffled = Block(
        torch.where(torch.arange(rows)[:, None] % 2 == 0, block.draft_tokens, other.draft_tokens)[perm],
        block.draft_probs[perm], block.target_probs[perm], "permuted, other unseeded neighbours",
    )
    _, t2 = _run_with_global_seed(backend, shuffled, [seeds[int(b)] for b in perm], 2, "permuted batch, global seed 2", ctx.device)
    back = t2[perm.argsort()]
    for b in range(0, rows, 2):
        assert torch.equal(back[b], t1[b]), (
            f"row {b} (seed {seeds[b]}) gave {t1[b].tolist()} at position {b} but {back[b].tolist()} at position "
            f"{int(perm.argsort()[b])} of a permuted batch with other unseeded neighbours and another global RNG state"
        )
    same = Block(block.draft_tokens[1:2].expand(64, -1), block.draft_probs[1:2].expand(64, -1, -1), block.target_probs[1:2].expand(64, -1, -1), "same input")
    _, copies = _run_with_global_seed(backend, same, [None] * 64, 3, "64 unseeded rows with identical inputs", ctx.device)
    assert not (copies == copies[:1]).all(), (
        f"64 unseeded rows with identical inputs all gave {copies[0].tolist()}: unseeded rows must draw fresh randomness, "
        "not one default seed each"
    )


@check(
    guards="rows of a mixed seeded/unseeded batch swapped or regrouped (vLLM issue 9441: garbage for mixed batches), "
    "unseeded rows drawing from a biased or reused stream",
    requires=("verifier", "sampling", "batched", "row_generators"),
    statistical=True,
)
def check_sampling_mixed_batch_group_laws(backend, ctx: CheckContext):
    """In batches mixing seeded rows (one scenario) and unseeded rows (another), each group keeps its own
    scenario's exact laws: accepted length and first emitted token, power 0.99 against TV 0.02 each."""
    spec = declared_scheme(backend)
    groups = {"seeded": (BATCH_FILLER, 0), "unseeded": (STAT_SCENARIOS["balanced"], 1)}
    laws = {name: exact.block_law(spec, sc.target, sc.draft) for name, (sc, _) in groups.items()}
    tv = MIXED_BATCH_TV
    needed = max(required_samples(law.length, tv) for law in laws.values())
    needed = max([needed] + [required_samples(law.emitted(0), tv) for law in laws.values()])
    rows = 2048
    chunks = max(1, -(-scaled_blocks(with_margin(needed), batched=True, scale=ctx.sample_scale) // (rows // 2)))
    k, vocab = BATCH_FILLER.k, BATCH_FILLER.vocab
    counts = {name: (np.zeros(k + 1, dtype=np.int64), np.zeros(vocab, dtype=np.int64)) for name in groups}
    for c in range(chunks):
        block = _mixed_block(rows, ctx.seed_for("mixed-laws-block", c))
        m, tokens = _run_with_global_seed(
            backend, block, _row_seeds(rows, ctx.seed_for("mixed-laws", c)), ctx.seed_for("mixed-global", c), f"mixed batch {c}", ctx.device
        )
        for name, (_, parity) in groups.items():
            length, first = counts[name]
            length += np.bincount(m[parity::2].numpy(), minlength=k + 1)
            first += np.bincount(tokens[parity::2, 0].numpy(), minlength=vocab)
    for name, (sc, _) in groups.items():
        length, first = counts[name]
        kw = dict(tv=tv, seed=ctx.seed_for("mixed-laws"), replay=ctx.replay)
        what = f"{name} rows of mixed seeded/unseeded batches [scheme {spec.label}; scenario {sc.describe()}]: "
        ctx.record(assert_fits(length, laws[name].length, what=what + "accepted length m", labels=_length_labels(k), **kw))
        ctx.record(assert_fits(first, laws[name].emitted(0), what=what + "first emitted token", labels=_token_labels(vocab), **kw))
