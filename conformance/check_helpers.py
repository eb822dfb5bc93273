"""Helpers the check modules share: the random models and prompts, the decode call with its stop invariants, the
numerical-flip classification, the cache hook, and the sequence-law and efficiency machinery on the exactly-known
pairs.

Check modules import them from here, never from one another (``decoder_checks`` re-exports the names users
imported from it before).
"""

import functools
import math
import torch

from specdec_properties.sampling import call_backend
from specdec_properties.stateful_cache import compare_kv, fresh_prefill
from specdec_properties.stats import assert_total
from specdec_ref.contract import Request
from specdec_ref.decode import autoregressive_decode
from specdec_ref.models import make_draft, tiny_lm
from specdec_ref.warp import GREEDY, SamplingConfig, warp

from . import streams
from .registry import CheckContext, NotApplicable, exact_scheme


ARCHS = ("llama", "qwen2", "gpt2")
DRAFT_FAMILIES = (("identical", {}), ("noisy", {"noise": 0.05}), ("noisy", {"noise": 0.2}), ("independent", {}))


@functools.lru_cache(maxsize=None)
def model_pair(arch: str, family: str, noise: float = 0.0, dtype: str = "float32", vocab: int = 16):
    """A seeded tiny target and a draft of the given family (cached; treat as read-only)."""
    target = tiny_lm(arch, vocab_size=vocab, seed=11, init_scale=2.0)
    kwargs = {"noise": noise} if family == "noisy" else {}
    draft = make_draft(target, family, seed=12, **kwargs)
    dt = getattr(torch, dtype)
    return target.to(dt), draft.to(dt)


def prompts(seed: int, count: int, length: int = 6, vocab: int = 16) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (1, length), generator=g) for _ in range(count)]


def assert_stops(result, *, max_new_tokens: int, eos_ids, min_new_tokens: int = 0, bonus: bool = True, where: str) -> None:
    """Stop and round invariants of one decode's result (run on every decode the suite makes; deterministic).

    The finish reason is ``eos`` iff the last token is one of ``eos_ids``, otherwise exactly ``max_new_tokens``
    tokens were emitted; no EOS before the last token, none before ``min_new_tokens``; the rounds' emitted counts add
    up to the output; every round but the last emits ``accepted + 1`` tokens (``accepted`` for a fully accepted round
    of a no-bonus backend).
    """
    __tracebackhide__ = True
    tokens = result.tokens
    eos = () if eos_ids is None else (eos_ids,) if isinstance(eos_ids, int) else tuple(eos_ids)
    n = max_new_tokens
    assert len(tokens) <= n, f"{where}: {len(tokens)} tokens emitted, max_new_tokens is {n}: {tokens}"
    early = [i for i, t in enumerate(tokens[:-1]) if t in eos]
    assert not early, f"{where}: EOS emitted at position {early[0] if early else 0} and generation went on: {tokens}"
    ends_in_eos = bool(tokens) and tokens[-1] in eos
    finished_by = getattr(result, "finished_by", None)
    if finished_by == "eos":
        assert ends_in_eos, f"{where}: finished_by='eos' but the last token is not an EOS id {eos}: {tokens}"
    else:
        assert finished_by == "max_new_tokens", f"{where}: finished_by={finished_by!r} (eos | max_new_tokens)"
        assert not ends_in_eos, f"{where}: the output ends in EOS {tokens[-1]} but finished_by='max_new_tokens': {tokens}"
        assert len(tokens) == n, f"{where}: finished by max_new_tokens after {len(tokens)} tokens, not {n}: {tokens}"
    if ends_in_eos and min_new_tokens:
        assert len(tokens) > min_new_tokens, (
            f"{where}: EOS at position {len(tokens) - 1} although min_new_tokens={min_new_tokens}: {tokens}"
        )
    rounds = list(getattr(result, "rounds", None) or [])
    if rounds:
        emitted = sum(r.emitted for r in rounds)
        assert emitted == len(tokens), f"{where}: the rounds emitted {emitted} tokens in all, the output has {len(tokens)}"
        for r in rounds[:-1]:
            expected = r.accepted if (not bonus and r.proposed and r.accepted == r.proposed) else r.accepted + 1
            assert r.emitted == expected, (
                f"{where}, round {r.round}: emitted {r.emitted} tokens with {r.accepted} of {r.proposed} drafts accepted; "
                f"a round that does not end generation emits exactly {expected} (the accepted drafts and one "
                "replacement / bonus)"
            )


def _decode(backend, target, draft, prompt, **kw):
    """backend.decode with its failures named: an exception is a BackendError naming the call
    (an ``error`` record), a malformed result fails the check."""
    __tracebackhide__ = True
    settings = {key: kw[key] for key in ("k", "max_new_tokens", "sampling", "eos_id") if key in kw}
    result = call_backend(backend.decode, target, draft, prompt, **kw, what=f"decode() (prompt {prompt.tolist()}, {settings})")
    tokens = getattr(result, "tokens", None)
    if not isinstance(tokens, list) or not all(isinstance(x, int) for x in tokens):
        raise AssertionError(f"decode() must return a result whose .tokens is a list of ints, got {type(tokens).__name__}")
    sampling = kw.get("sampling", GREEDY)
    assert_stops(result, max_new_tokens=kw["max_new_tokens"], eos_ids=kw.get("eos_id"), min_new_tokens=sampling.min_new_tokens,
                 bonus=getattr(backend.capabilities, "bonus", True), where=f"decode() (prompt {prompt.tolist()}, {settings})")
    return result


#: AR greedy outputs of the suite's own seeded targets, by (recipe, dtype, prompt, max_new_tokens): the oracle is
#: deterministic and the recipe fixes the weights, so the chain and tree checks (and both tree widths) share it.
_AR_OF: dict = {}


def _greedy_ar(target, prompt: torch.Tensor, dtype: str, max_new: int):
    recipe = getattr(target, "specdec_recipe", None)
    if recipe is None:
        return autoregressive_decode(target, prompt, max_new_tokens=max_new)
    key = (repr(recipe), dtype, tuple(prompt[0].tolist()), max_new)
    if key not in _AR_OF:
        _AR_OF[key] = autoregressive_decode(target, prompt, max_new_tokens=max_new)
    return _AR_OF[key]


def _greedy_equality(backend, ctx: CheckContext, arch: str, dtype: str, max_new: int):
    verdicts, runs = [], 0
    for family, kw in DRAFT_FAMILIES:
        target, draft = model_pair(arch, family, kw.get("noise", 0.0), dtype)
        for prompt in prompts(ctx.seed_for("greedy", arch), 4):
            ar = _greedy_ar(target, prompt, dtype, max_new)  # the families' targets are one recipe (model_pair)
            for k in (1, 2, 4, 8):
                spec = _decode(backend, target, draft, prompt, k=k, max_new_tokens=max_new, sampling=GREEDY)
                runs += 1
                if spec.tokens == ar.tokens:
                    continue
                where = f"{arch} {dtype}, draft {family} {kw}, k={k}, prompt {prompt.tolist()}"
                verdicts.append((where, assert_numerical_flip(target, prompt, spec.tokens, ar.tokens, dtype, where, ctx)))
    return runs, verdicts


def assert_numerical_flip(target, prompt: torch.Tensor, got: list[int], ar: list[int], dtype: str, where: str, ctx: CheckContext):
    """A greedy output ``got`` that differs from AR's ``ar`` must diverge by a numerical flip (``specdec_properties.flips``: the
    target's top-1/top-2 gap at the first differing position is within ``dtype``'s tolerance); the flip is recorded as
    a finding of the check, anything else fails it."""
    __tracebackhide__ = True
    from specdec_properties.flips import classify_sequences

    verdict = classify_sequences(target, prompt, got, ar, dtype_under_test=getattr(torch, dtype))
    if verdict is None or verdict.kind != "numerical_flip":
        detail = verdict.describe() if verdict is not None else "outputs differ"
        raise AssertionError(
            f"greedy speculative output differs from AR decoding ({where}): algorithmic divergence.\n"
            f"  speculative: {got}\n  AR:          {ar}\n  {detail}\n  replay: {ctx.replay}"
        )
    ctx.findings.append({**verdict.as_record(), "kind": "numerical_flip", "where": where})
    return verdict


def _cache_hook(target, draft, full_tokens: list[int], where: str):
    """``on_round`` hook comparing both caches with a fresh prefill of the committed tokens but the pending one.

    Each model's oracle is one fresh prefill of ``full_tokens`` but the last (the most any round can commit but its
    pending token), made at the first round and cut to each round's prefix: the models are causal, so the K/V of a
    prefix's positions are the same whatever follows it (equal up to the kernels' reduction order, far inside
    ``compare_kv``'s tolerance), and a decode pays one prefill per model instead of one per round."""
    oracles: dict[int, list] = {}
    longest = len(full_tokens) - 1

    def fresh_prefix(model, n: int):
        if n > longest:  # a record committing more than the decode emitted: the prefix itself (the lengths then differ)
            return fresh_prefill(model, full_tokens[:n])[1]
        kv = oracles.get(id(model))
        if kv is None:
            kv = oracles[id(model)] = fresh_prefill(model, full_tokens[:longest])[1]
        return [(k[:, :, :n], v[:, :, :n]) for k, v in kv]

    def hook(record, target_cache, draft_cache):
        __tracebackhide__ = True
        assert record.target_len == record.draft_len == record.committed_len - 1, (
            f"{where}, round {record.round}: target cache {record.target_len}, draft cache {record.draft_len}, "
            f"committed {record.committed_len}: both caches must hold the committed tokens but the pending last one"
        )
        n = len(full_tokens[: record.committed_len - 1])
        context = f" ({where}, round {record.round}, committed tokens {full_tokens[: record.committed_len]})"
        compare_kv(target_cache.layer_kv(), fresh_prefix(target, n), context=" in the target cache" + context)
        compare_kv(draft_cache.layer_kv(), fresh_prefix(draft, n), context=" in the draft cache" + context)

    return hook


@functools.lru_cache(maxsize=None)
def sequence_models(pair_name: str):
    """The float32 checkpoints of an exact pair (``specdec_ref.exact``; cached, treat as read-only)."""
    from specdec_ref.exact import exact_pair

    pair = exact_pair(pair_name)
    return pair.target.load(torch.float32), pair.draft.load(torch.float32)


def _require_filters(backend, sampling: SamplingConfig, case: str) -> None:
    """:class:`NotApplicable` when the case samples with a filter (top-k / top-p / min-p) the backend does not claim."""
    used = [flag for flag in ("top_k", "top_p", "min_p") if getattr(sampling, flag) is not None]
    unclaimed = [flag for flag in used if not backend.capabilities.has(flag)]
    if unclaimed:
        raise NotApplicable(f"case {case} samples with {', '.join(used)}; the backend does not claim {unclaimed}")


def assert_continuations_follow(cells, outputs, ctx: CheckContext, *, what: str, tv: float, seed: int, sensitive_to: str) -> None:
    """The decoded continuations ``outputs`` fit the law's ``cells`` (``specdec_properties.stats.goodness_of_fit``: N, alpha,
    power against ``tv`` stated, recorded on ``ctx``); on failure the report, impossible examples and the bug classes
    the case is sized for."""
    __tracebackhide__ = True
    from specdec_properties.stats import goodness_of_fit

    result = goodness_of_fit(cells.counts(outputs), cells.probs, what=what, labels=cells.labels, tv=tv, seed=seed,
                             replay=ctx.replay)
    ctx.record(result)
    if not result.passed:
        message = result.report()
        if result.impossible:
            message += f"\nimpossible continuations, e.g.: {cells.impossible_examples(outputs)}"
        raise AssertionError(message + f"\nthis case is sensitive to: {sensitive_to}")


#: The efficiency check: an exactly-known order-1 pair (the rows of a round depend only on the last
#: committed token, so each round's exact law is cheap), its settings, draft length and decodes.
EFFICIENCY_PAIR = "order1-far"


EFFICIENCY_SAMPLING = SamplingConfig(temperature=0.7)


EFFICIENCY_K = 4


EFFICIENCY_DECODES = 150


EFFICIENCY_NEW_TOKENS = 64


@functools.lru_cache(maxsize=None)
def efficiency_tables(pair_name: str, sampling: SamplingConfig):
    """The pair's warped tables as a :class:`specdec_properties.markov.MarkovPair` (row ``a``: after token ``a``)."""
    from specdec_properties.markov import MarkovPair
    from specdec_ref.exact import exact_pair

    pair = exact_pair(pair_name)
    contexts = [[a] for a in range(pair.target.vocab)]
    rows = [warp(m.next_logits(contexts), sampling, dtype=torch.float64).numpy() for m in (pair.target, pair.draft)]
    return MarkovPair(name=pair_name, target=rows[0], draft=rows[1], start=0, purpose=f"{pair_name} warped by {sampling}")


#: Efficiency cases whose outcome the order of temperature and filters moves (``EFFICIENCY_PAIR``, k = 4,
#: 150 decodes of 64 tokens, about 3 000-4 500 rounds each). A representative deviation, the draft proposing
#: from ``softmax(filters(z) / T)`` (filters on the raw logits, temperature after) while reporting that q
#: honestly (exact, acceptance moved), shifts the exact mean accepted drafts per round by the stated amount: at a
#: uniform start token, and along the decodes (weighted by where rounds start: the warped target chain's occupancy
#: over 64 tokens), with that shift in standard errors of a 3 000-round total (tests/test_lossless_decoder.py).
FILTERED_EFFICIENCY: dict[str, tuple[SamplingConfig, str]] = {
    "cold": (SamplingConfig(temperature=0.5, top_k=4, top_p=0.7),
             "0.456 -> 0.609 at a uniform start, 0.060 -> 0.299 along the decodes (+61 SE)"),
    "hot": (SamplingConfig(temperature=1.5, top_k=4, top_p=0.9),
            "1.168 -> 1.004 at a uniform start, 1.232 -> 1.039 along the decodes (-8 SE)"),
    "min_p": (SamplingConfig(temperature=1.5, min_p=0.1),
              "1.518 -> 1.242 at a uniform start, 1.504 -> 1.229 along the decodes (-10 SE)"),
}


def efficiency_scheme(backend):
    """The declared exact scheme whose acceptance law the efficiency checks test (a lossy one: not applicable)."""
    return exact_scheme(backend, "a lossy scheme declares no exact acceptance law; its tokens per call are measured instead")


def efficiency_prompts(ctx: CheckContext, seed_key: str) -> tuple[torch.Tensor, int]:
    """The efficiency checks' prompts: ``(prompts, rows)``, :func:`look_prompts` of a fixed count under every profile
    (``EFFICIENCY_DECODES``); a look decodes its share of it, the first ``rows``."""
    from specdec_ref.exact import exact_pair

    return look_prompts(ctx, f"{seed_key}-prompts", EFFICIENCY_DECODES, exact_pair(EFFICIENCY_PAIR).target.vocab)


#: The largest share of its sample any look of a case draws (``run_case``'s full look after an early-pass look
#: draws ``reserve_scale()`` = 1.07); the rows of :func:`look_prompts` are drawn for this share once.
MAX_LOOK_FRACTION = 2


def look_prompts(ctx: CheckContext, seed_key: str, decodes: int, vocab: int, length: int = 3) -> tuple[torch.Tensor, int]:
    """``(prompts, rows)``: one fixed draw of ``[MAX_LOOK_FRACTION x decodes, length]`` prompts, the same at every look
    of a case (what a stream's draw function may read, ``conformance.streams``), and the ``ceil(decodes x look share)``
    of them this look decodes."""
    rows = max(1, math.ceil(decodes * ctx.look_fraction))
    if rows > MAX_LOOK_FRACTION * decodes:
        raise ValueError(f"a look of {ctx.look_fraction:g} of the sample exceeds the prompts drawn ({MAX_LOOK_FRACTION}x)")
    generator = torch.Generator().manual_seed(ctx.seed_for(seed_key))
    return torch.randint(0, vocab, (MAX_LOOK_FRACTION * decodes, length), generator=generator), rows


def round_totals(prompts, results, moments_of) -> tuple[int, list[float], list[float]]:
    """``(accepted, means, variances)`` over every round with drafts of ``results`` (decodes of ``prompts`` on an order-1
    pair): the accepted count against ``moments_of(proposed)``'s exact ``[V]`` mean and variance at the round's last
    committed token (an order-1 round depends on that token only)."""
    means, variances, accepted = [], [], 0
    for prompt, result in zip(prompts, results):
        full = list(prompt) + list(result.tokens)
        for r in result.rounds:
            if r.proposed == 0:
                continue  # a plain target step
            mean, var = moments_of(r.proposed)
            last = full[r.start - 1]
            means.append(mean[last])
            variances.append(var[last])
            accepted += r.accepted
    return accepted, means, variances


def assert_rounds_accept_ideally(ctx: CheckContext, scheme, sampling: SamplingConfig, prompts: list[list[int]], results,
                                 *, where: str) -> None:
    """The accepted drafts of every drafted round of ``results`` (decodes of ``prompts`` on ``EFFICIENCY_PAIR``) against
    the declared scheme's exact expectation given the round's last committed token (``specdec_properties.markov``; normal test
    of the total, recorded on ``ctx``)."""
    from specdec_properties.markov import accepted_moments

    tables = efficiency_tables(EFFICIENCY_PAIR, sampling)
    moments: dict[int, tuple] = {}

    def moments_of(proposed: int):
        if proposed not in moments:
            moments[proposed] = accepted_moments(tables, scheme, proposed)
        return moments[proposed]

    accepted, means, variances = round_totals(prompts, results, moments_of)
    settings = ", ".join(f"{k}={v}" for k, v in sampling.as_dict().items() if k in ("temperature", "top_k", "top_p", "min_p") and v is not None)
    ctx.record(
        assert_total(
            accepted, means, variances, unit="accepted drafts",
            what=f"{where}accepted drafts per round vs the exact expectation of the declared scheme ({scheme.label}) "
            f"on {EFFICIENCY_PAIR} at {settings}, k={EFFICIENCY_K}",
        )
    )


# ----------------------------------------------------------------------------- batched decoding


def _needs(backend, config: SamplingConfig) -> list[str]:
    """The capabilities a request with ``config`` needs that the backend does not claim."""
    flags = ["greedy"] if config.greedy else ["sampling"]
    flags += [f for f in ("top_k", "top_p", "min_p") if not config.greedy and getattr(config, f) is not None]
    if config.history_dependent:
        flags.append("history_sampling")
    return [f for f in flags if not backend.capabilities.has(f)]


def _claimed(backend, configs) -> list[SamplingConfig]:
    return [c for c in configs if not _needs(backend, c)]


def decode_batch(backend, target, draft, requests: list[Request], *, k: int, where: str, on_round=None):
    """``backend.decode_batch`` with failures named and every result's stops checked."""
    __tracebackhide__ = True
    results = call_backend(backend.decode_batch, target, draft, requests, k=k, on_round=on_round,
                           what=f"decode_batch() ({where}, {len(requests)} requests, k={k})")
    assert isinstance(results, (list, tuple)) and len(results) == len(requests), (
        f"{where}: decode_batch must return one result per request ({len(requests)}), got {type(results).__name__} "
        f"of length {len(results) if hasattr(results, '__len__') else '?'}"
    )
    bonus = backend.capabilities.bonus
    for i, (res, req) in enumerate(zip(results, requests)):
        tokens = getattr(res, "tokens", None)
        assert isinstance(tokens, list) and all(isinstance(x, int) for x in tokens), (
            f"{where}, request {i}: .tokens must be a list of ints, got {type(tokens).__name__}"
        )
        stops = dict(max_new_tokens=req.max_new_tokens, eos_ids=req.eos_ids, min_new_tokens=req.sampling.min_new_tokens, bonus=bonus)
        try:  # the row's name is formatted only when its stops fail (thousands of rows per call)
            assert_stops(res, **stops, where="")
        except AssertionError:
            assert_stops(res, **stops, where=f"{where}, request {i} (prompt {_ids(req.prompt)})")
            raise
    return results


def row_dependence_note() -> str:
    """For a batch-invariance failure's report: a note when this process's float32 products are row-dependent on this
    machine (``specdec_ref.row_products``), which flips a near-tie token with the batch without a bug of the
    backend's own; empty otherwise. Probed only when a check fails."""
    import os

    from specdec_ref.row_products import MKL_STRICT, row_dependent_products

    found = row_dependent_products()
    if not found:
        return ""
    return (f"\n  note: in this process row b of a float32 F.linear depends on the number of rows ({len(found)} of the "
            f"probe's products, e.g. (in, out, rows) = {found[0]}; MKL_CBWR={os.environ.get('MKL_CBWR')!r}). A backend "
            f"computing with these kernels can flip a token at a near-tie with its batch; to tell that apart from a bug, "
            f"rerun with MKL_CBWR={MKL_STRICT} set before the process starts, or where that is not enough (an AMD "
            f"EPYC) with one product per row (specdec_ref.row_products.per_row_linear; docs/batching.md).")


def _ids(prompt) -> list[int]:
    return prompt.reshape(-1).tolist() if isinstance(prompt, torch.Tensor) else list(prompt)


def _mixed_requests(seed: int, configs, count: int, vocab: int = 16) -> list[Request]:
    """``count`` requests with ragged prompts (1..9 tokens), budgets (3..14), EOS ids and settings drawn from ``configs``;
    every other one seeded."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        length = int(torch.randint(1, 10, (1,), generator=g))
        prompt = torch.randint(0, vocab, (length,), generator=g).tolist()
        config = configs[i % len(configs)]
        eos = int(torch.randint(0, vocab, (1,), generator=g)) if i % 3 else None
        out.append(Request(prompt=prompt, max_new_tokens=int(torch.randint(3, 15, (1,), generator=g)), sampling=config,
                           eos_ids=eos, seed=seed * 100 + i if i % 2 == 0 else None))
    return out


#: A backend claiming ``batched_decoder`` answers ``decoder_sequence_law`` in rows of ``decode_batch`` (the contract:
#: ``decode`` is its one-request case and a seeded row is bit-identical alone or in any batch), this many per call.
SEQUENCE_ROWS_BATCH = 1024
#: The rows' chi-square is sized for this share of the case's TV; the rest is the decodes' part (below).
ROWS_TV_SHARE = 2 / 3


def rows_tv(tv: float) -> float:
    """The TV the rows' chi-square is sized for when the case states ``tv`` for ``decode``."""
    return tv * ROWS_TV_SHARE


def decodes_alike(tv: float) -> int:
    """M: the decodes compared seed for seed with the first M rows. A ``decode`` whose law is at TV ``g = tv -
    rows_tv(tv)`` or more from the rows' law gives another continuation than its row under the same generator with
    probability >= g per seed (any coupling of two laws differs with probability >= their TV), so M decodes alike
    miss it with probability <= (1 - g)^M <= 1 - TARGET_POWER."""
    from specdec_properties.stats import TARGET_POWER

    return math.ceil(math.log1p(-TARGET_POWER) / math.log1p(-(tv - rows_tv(tv))))


def law_in_rows_then_alike(backend, ctx: CheckContext, cells, *, key: tuple, seed: int, tv: float, what: str,
                           sensitive_to: str, samples, request: dict, rows, one) -> None:
    """The rows-then-alike test (:func:`rows_law_then_decodes_alike`) for any law of one request: ``samples(tv)`` rows
    at TV ``rows_tv(tv)``, drawn ``SEQUENCE_ROWS_BATCH`` per ``rows(requests, where)`` call (row i: ``request`` with a
    generator seeded ``seed + i``), then ``one(generator)`` (the one-request call) equal to the first M rows."""
    from specdec_properties.stats import TARGET_POWER

    row_tv = rows_tv(tv)
    n = math.ceil(samples(row_tv) * ctx.sample_scale)

    def draw(_, index, size):
        ids = range(index * size, (index + 1) * size)
        requests = [Request(**request, generator=torch.Generator().manual_seed(seed + i)) for i in ids]
        return [tuple(r.tokens) for r in rows(requests, f"rows {ids[0]}..")]

    outputs = streams.draws(ctx.streams, (*key, "rows"), n, start=lambda: None, draw=draw, chunk=SEQUENCE_ROWS_BATCH)
    alike = min(decodes_alike(tv), len(outputs))
    single, rows_call = getattr(backend, "call_names", ("decode()", "decode_batch()"))
    assert_continuations_follow(
        cells, outputs, ctx, tv=row_tv, seed=seed, sensitive_to=sensitive_to,
        what=f"{what}; rows of {rows_call}, each its own generator ({single} must give the same continuation for the "
        f"first {alike} generators; the two together: power {TARGET_POWER} against every {single} law at TV >= {tv:g})",
    )
    checked = streams.memo(ctx.streams, (*key, "alike"))
    for i in range(alike):
        if i in checked:
            continue
        got = tuple(one(torch.Generator().manual_seed(seed + i)).tokens)
        assert got == outputs[i], (
            f"{single} and {rows_call} differ for the same generator (seed {seed + i}; {what}):\n"
            f"  {single}:{' ' * max(1, 21 - len(single))}{list(got)}\n  {rows_call} row {i}: {list(outputs[i])}\n"
            f"the contract: {single} is {rows_call}'s one-request case, and a seeded row is bit-identical alone or in any "
            f"batch\n  replay: {ctx.replay}"
        )
        checked[i] = True
