"""Efficiency conformance of a batched speculative decoder: acceptance against the exact expectation of each row's own
history and settings (greedy: exactly; sampling: the declared scheme's mean), where the draft's settings matter.

A lossless decoder whose draft proposes from other settings (unpenalised, unfiltered, warped in another order) keeps
the law and loses acceptance: only these checks see it. Same family as ``batch_checks`` (``conformance/test_batch.py``).
"""
from __future__ import annotations

import math

import torch

from specdec_ref.contract import Request
from specdec_ref.warp import SamplingConfig

from .check_helpers import (
    EFFICIENCY_K,
    EFFICIENCY_NEW_TOKENS,
    EFFICIENCY_PAIR,
    FILTERED_EFFICIENCY,
    MAX_LOOK_FRACTION,
    _needs,
    assert_rounds_accept_ideally,
    decode_batch,
    efficiency_prompts,
    efficiency_scheme,
    sequence_models,
)
from . import streams
from .profiles import get_profile
from .registry import CheckContext, NotApplicable, check, exact_scheme

#: Settings of the deterministic checks: plain sampling, with filters, and with every history-dependent setting.

#: The test file these checks run in (``conformance/test_batch.py``), as for ``batch_checks``.
FAMILY = "batch"


#: The efficiency checks: an order-1 exact pair, short prompts, k = 2, and settings with strong penalties *and*
#: filters (the close draft often repeats a token inside a block, where the penalties bite).
ACCEPTANCE_PAIR = "order1-close"


ACCEPTANCE_K = 2


ACCEPTANCE_REQUESTS = 1000


ACCEPTANCE_NEW_TOKENS = 6


ACCEPTANCE_SAMPLING = SamplingConfig(temperature=1.0, top_k=4, top_p=0.9, repetition_penalty=2.0, frequency_penalty=1.0)


GREEDY_PENALISED = SamplingConfig(greedy=True, repetition_penalty=1.8, frequency_penalty=0.8, logit_bias={4: 0.6})


def _acceptance_requests(seed: int, sampling: SamplingConfig, count: int, vocab: int) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab, (count, 2), generator=g).tolist()
    return [Request(prompt=p, max_new_tokens=ACCEPTANCE_NEW_TOKENS, sampling=sampling, seed=None if sampling.greedy else seed + i)
            for i, p in enumerate(prompts)]


#: Rows per ``decode_batch`` call of the batched acceptance checks: a look decodes whole batches of its planned rows.
ACCEPTANCE_BATCH = 50


def _seeded_rows(ctx: CheckContext, key: str, planned: list[Request], n: int, decode) -> list:
    """The results of the first ``n`` of the ``planned`` requests (each seeded on its own, so a row's result does not
    depend on the batch it is in), decoded ``ACCEPTANCE_BATCH`` at a time by ``decode(requests)``: every look of a case
    decodes only the rows earlier looks did not (``conformance.streams``)."""
    if n > len(planned):
        raise ValueError(f"a look of {n} rows exceeds the {len(planned)} planned")
    return streams.draws(ctx.streams, key, n, start=lambda: None, chunk=ACCEPTANCE_BATCH,
                         draw=lambda _, i, size: decode(planned[i * size:(i + 1) * size]))


def _rounds_with_history(request: Request, result):
    """``(round, generated tokens before it, its emitted tokens)`` for every round with drafts."""
    at = 0
    for r in result.rounds:
        yield r, result.tokens[:at], result.tokens[at: at + r.emitted]
        at += r.emitted


@check(
    guards="greedy acceptance lost: the draft proposing from other settings or another history than the target's "
    "(penalties or bias skipped on the draft side), drafts verified against the wrong rows, early rejection",
    requires=("batched_decoder", "greedy", "history_sampling"),
)
def check_batch_greedy_acceptance_is_exact(backend, ctx: CheckContext):
    """On the exactly-known order-1 pair, greedy with penalties and a logit bias (k = 2): every round but the last
    accepts exactly the drafts an ideal draft would (the leading positions where the draft's argmax on the same
    history, settings applied, equals the emitted greedy token; ``specdec_properties.acceptance.greedy_accepted``)."""
    from specdec_properties.acceptance import greedy_accepted
    from specdec_ref.exact import exact_pair

    pair = exact_pair(ACCEPTANCE_PAIR)
    target, draft = sequence_models(ACCEPTANCE_PAIR)
    requests = _acceptance_requests(ctx.seed_for("batch-greedy-acceptance"), GREEDY_PENALISED, 48, pair.target.vocab)
    results = decode_batch(backend, target, draft, requests, k=ACCEPTANCE_K, where="greedy acceptance batch")
    checked = 0
    for i, (req, res) in enumerate(zip(requests, results)):
        for r, generated, emitted in list(_rounds_with_history(req, res))[:-1]:
            if r.proposed == 0:
                continue
            exact = greedy_accepted(pair.draft, req.prompt, generated, emitted, GREEDY_PENALISED, r.proposed)
            if exact is None:
                continue
            checked += 1
            assert r.accepted == exact, (
                f"request {i} (prompt {req.prompt}, {GREEDY_PENALISED.label()}), round {r.round} after generated "
                f"{generated}: accepted {r.accepted} of {r.proposed} drafts, an ideal greedy draft has {exact} accepted "
                f"(emitted {emitted}); the draft does not propose the argmax of its processed logits on the same history"
            )
    assert checked >= 50, f"only {checked} rounds could be judged (the rest ended a decode or had draft ties): inconclusive"


@check(
    guards="acceptance lost without bias under penalties and filters: the draft sampling from unpenalised or "
    "unfiltered logits (reported q consistent), penalties on one side, another scheme than declared",
    requires=("batched_decoder", "sampling", "history_sampling", "top_k", "top_p"),
    statistical=True,
)
def check_batch_acceptance_is_ideal(backend, ctx: CheckContext):
    """Accepted drafts per round equal the declared scheme's exact expectation for the warped ``p`` and ``q`` of each
    row's own history (``specdec_properties.acceptance.round_acceptance_moments``: penalties, top-k and top-p applied at every
    block position), on the exactly-known order-1 pair, rows seeded one by one; normal test of the total over every
    round with drafts, power stated against the smallest detectable shift of the mean per round."""
    from specdec_properties.acceptance import round_acceptance_moments
    from specdec_properties.stats import assert_total
    from specdec_ref.exact import exact_pair

    scheme = exact_scheme(backend, "a lossy scheme declares no exact acceptance law")
    pair = exact_pair(ACCEPTANCE_PAIR)
    target, draft = sequence_models(ACCEPTANCE_PAIR)
    n = math.ceil(ACCEPTANCE_REQUESTS * ctx.sample_scale)
    seed = ctx.seed_for("batch-acceptance")
    planned = _acceptance_requests(seed, ACCEPTANCE_SAMPLING, math.ceil(ACCEPTANCE_REQUESTS * MAX_LOOK_FRACTION * get_profile(ctx.profile).sample_scale), pair.target.vocab)
    requests = planned[:n]
    results = _seeded_rows(ctx, "batch-acceptance", planned, n, lambda rows: decode_batch(
        backend, target, draft, rows, k=ACCEPTANCE_K, where=f"acceptance batch of {len(rows)} rows"))
    memo: dict[tuple, tuple[float, float]] = streams.memo(ctx.streams, "acceptance-moments")  # shared by the looks
    means, variances, accepted = [], [], 0
    for req, res in zip(requests, results):
        for r, generated, _ in _rounds_with_history(req, res):
            if r.proposed == 0:
                continue
            key = (tuple(req.prompt), tuple(generated), r.proposed)
            if key not in memo:
                memo[key] = round_acceptance_moments(pair.target, pair.draft, req.prompt, generated, ACCEPTANCE_SAMPLING,
                                                     r.proposed, scheme)
            mean, var = memo[key]
            means.append(mean)
            variances.append(var)
            accepted += r.accepted
    ctx.record(assert_total(
        accepted, means, variances, unit="accepted drafts",
        what=f"accepted drafts per round vs the exact expectation of the declared scheme ({scheme.label}) on "
        f"{ACCEPTANCE_PAIR} under {ACCEPTANCE_SAMPLING.label()}, k={ACCEPTANCE_K}",
    ))


@check(
    guards="acceptance moved without bias in batched rows where the order of temperature and filters matters: the "
    "draft proposing from a differently warped distribution than the declared one (on the right history) while "
    "reporting it honestly",
    requires=("batched_decoder", "sampling"),  # top_k / top_p / min_p per case: a case using an unclaimed filter is skipped
    cases=[(name, {"case": name}) for name in FILTERED_EFFICIENCY],
    statistical=True,
)
def check_batch_acceptance_under_filters(backend, ctx: CheckContext, case: str):
    """``decoder_acceptance_under_filters`` on batched rows: the same 150 three-token prompts' worth of rows (64 new
    tokens, k = 4, each row seeded) in one ``decode_batch`` on ``order1-far``, each case's settings on every row.

    Accepted drafts per drafted round against the declared scheme's exact expectation given the round's last token.
    The representative deviation (the draft filtered before its temperature, on the row's own processed logits) moves
    the exact mean per round along the decodes from 0.060 to 0.299 (cold: T 0.5, top-k 4, top-p 0.7), 1.232 to 1.039
    (hot: T 1.5, top-k 4, top-p 0.9) and 1.504 to 1.229 (min_p: T 1.5, min-p 0.1), +61, -8 and -10 standard errors of a
    3 000-round total (``FILTERED_EFFICIENCY``); ``batch_acceptance_is_ideal`` runs at temperature 1, where the order
    cannot matter, and lets it through (tests/test_batch_decode.py).
    """
    sampling, _ = FILTERED_EFFICIENCY[case]
    unclaimed = _needs(backend, sampling)
    if unclaimed:
        raise NotApplicable(f"case {case} samples with {sampling.label()}; the backend does not claim {unclaimed}")
    scheme = efficiency_scheme(backend)
    target, draft = sequence_models(EFFICIENCY_PAIR)
    seed = ctx.seed_for(f"batch-efficiency-{case}")
    prompts, rows = efficiency_prompts(ctx, f"batch-efficiency-{case}")
    planned = [Request(prompt=p, max_new_tokens=EFFICIENCY_NEW_TOKENS, sampling=sampling, seed=seed + i)
               for i, p in enumerate(prompts.tolist())]
    prompts = prompts[:rows].tolist()
    results = _seeded_rows(ctx, f"batch-efficiency-{case}", planned, rows, lambda batch: decode_batch(
        backend, target, draft, batch, k=EFFICIENCY_K, where=f"case {case}, a batch of {len(batch)} rows"))
    assert_rounds_accept_ideally(ctx, scheme, sampling, prompts, results, where="batched rows: ")
