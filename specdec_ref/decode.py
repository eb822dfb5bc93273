"""The reference decoders: plain autoregressive (the oracle) and speculative decoding.

Speculative round (batch 1), with ``C`` committed tokens of which the last one
is *pending* (committed but not yet fed to either cache):

1. the draft feeds the pending token and proposes ``d_1..d_k``, sampling each
   from ``q_i = warp(draft logits)`` (``k`` draft calls);
2. the target feeds ``[pending, d_1..d_k]`` in one call: its rows 0..k are
   ``saved_next`` (after the pending token), the rows judging ``d_2..d_k`` and
   the bonus row (the alignment table of docs/algorithm.md: row ``i`` judges ``d_{i+1}``);
3. the verifier returns ``m`` and the emitted tokens; EOS ends the round and
   generation right after it, ``max_new_tokens`` is never exceeded;
4. repair: both caches keep exactly the committed tokens minus the new pending
   one (``commit(C' - 1)``); when all ``k`` drafts were accepted the draft also
   feeds ``d_k`` (it had only fed ``d_1..d_{k-1}``). The replacement or bonus is
   the new pending token, fed at the start of the next round, so it is written
   once to each cache and the target needs one call per round.

Invariant after every round: ``target_len == draft_len == committed_len - 1``;
nothing after an EOS is ever fed to either cache.

Host synchronisation: one per round (reading the emitted tokens to decide
EOS and how many to commit); none per drafted token. Acceptance is decided on
the device by :mod:`specdec_ref.verify`.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from .cache import ModelCache
from .contract import DecodeResult, RoundHook, RoundRecord
from .forward import as_prompt
from .models import model_dims
from .static_cache import fastest_cache
from .verify import BlockVerifier, sample_from_weights, verify_block
from .warp import GREEDY, SamplingConfig, warp

def _validate_decode_args(target, draft, prompt, k, max_new_tokens, eos_id, sampling) -> torch.Tensor:
    if not isinstance(sampling, SamplingConfig):
        raise ValueError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
    dims = model_dims(target)
    vocab, max_pos = dims["vocab_size"], dims["max_positions"]
    if draft is not None:
        draft_vocab = model_dims(draft)["vocab_size"]
        if draft_vocab != vocab:
            raise ValueError(f"vocabulary mismatch: target has V={vocab}, draft has V={draft_vocab}")
        max_pos = min(max_pos, model_dims(draft)["max_positions"])
    prompt = as_prompt(prompt, vocab=vocab, device=next(target.parameters()).device)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if eos_id is not None and (isinstance(eos_id, bool) or not isinstance(eos_id, int) or not 0 <= eos_id < vocab):
        raise ValueError(f"eos_id must be None or a token id in [0, {vocab}), got {eos_id!r}")
    if max_pos and prompt.shape[1] + max_new_tokens > max_pos + 1:
        raise ValueError(
            f"prompt length {prompt.shape[1]} + max_new_tokens {max_new_tokens} exceeds the models' "
            f"max positions {max_pos} (+1 for the last token, which is never fed)"
        )
    return prompt


def _choose(probs: torch.Tensor, sampling: SamplingConfig, generator) -> torch.Tensor:
    """Token per row of ``probs[..., V]``: argmax for greedy, a sample otherwise."""
    return probs.argmax(-1) if sampling.greedy else sample_from_weights(probs, generator)


def open_caches(make_cache, make_draft_cache, target, draft, prompt: torch.Tensor, needed: int, result: DecodeResult):
    """Target and draft caches sized for ``needed`` positions (capped at each model's), holding the prompt but its
    last token: that one is the first *pending* token, fed at the start of the first round."""
    t = prompt.shape[1]
    target_cache = make_cache(target, check_ids=False, max_length=min(needed, model_dims(target)["max_positions"] or needed))
    draft_cache = make_draft_cache(draft, check_ids=False, max_length=min(needed, model_dims(draft)["max_positions"] or needed))
    if t > 1:
        target_cache.feed(prompt[:, :-1])
        draft_cache.feed(prompt[:, :-1])
        result.target_calls += 1
        result.draft_calls += 1
    target_cache.commit(t - 1)
    draft_cache.commit(t - 1)
    return target_cache, draft_cache


def end_round(result: DecodeResult, on_round: RoundHook | None, target_cache, draft_cache, *, start: int, proposed: int,
              accepted: int, emitted: int, committed: int, hit_eos: bool) -> bool:
    """Record a finished round (its :class:`RoundRecord` with the caches' lengths after the repair), call
    ``on_round``, and mark an EOS finish; True when generation ends here."""
    record = RoundRecord(
        round=len(result.rounds),
        start=start,
        proposed=proposed,
        accepted=accepted,
        emitted=emitted,
        target_len=target_cache.tentative_length,
        draft_len=draft_cache.tentative_length,
        committed_len=committed,
        target_calls=result.target_calls,
        draft_calls=result.draft_calls,
    )
    result.rounds.append(record)
    if on_round is not None:
        on_round(record, target_cache, draft_cache)
    if hit_eos:
        result.finished_by = "eos"
    return hit_eos


def _truncate(emitted: list[int], eos_id: int | None) -> tuple[list[int], bool]:
    if eos_id is not None and eos_id in emitted:
        return emitted[: emitted.index(eos_id) + 1], True
    return emitted, False


def autoregressive_decode(
    target,
    prompt,
    *,
    max_new_tokens: int,
    sampling: SamplingConfig = GREEDY,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    make_cache: Callable[..., ModelCache] = ModelCache,
) -> DecodeResult:
    """Plain decoding from ``warp(target logits)``: the oracle speculative decoding must equal.

    As the oracle it runs the transformers forward (``ModelCache``); benchmarks may pass
    ``make_cache=fastest_cache`` for the fastest plain decoding on the same weights.
    """
    prompt = _validate_decode_args(target, None, prompt, 1, max_new_tokens, eos_id, sampling)
    result = DecodeResult(tokens=[], prompt_len=prompt.shape[1], finished_by="max_new_tokens")
    if max_new_tokens == 0:
        return result
    capacity = min(model_dims(target)["max_positions"] or 1 << 30, prompt.shape[1] + max_new_tokens)
    cache = make_cache(target, check_ids=False, max_length=capacity)
    logits = cache.feed(prompt)[:, -1]
    result.target_calls = 1
    while True:
        token = _choose(warp(logits, sampling), sampling, generator)
        value = int(token.item())
        result.host_syncs += 1
        result.tokens.append(value)
        if eos_id is not None and value == eos_id:
            result.finished_by = "eos"
            break
        if len(result.tokens) == max_new_tokens:
            break
        logits = cache.feed(token[:, None])[:, -1]
        result.target_calls += 1
    return result


class SpeculativeDecoder:
    """The reference speculative decoder; one overridable method per step (mutants override one).

    Caches default to :func:`~specdec_ref.static_cache.fastest_cache`: the static-buffer lean
    forward for Llama/Qwen2 models, the transformers ``DynamicCache`` adapter otherwise.
    """

    def __init__(
        self,
        verifier: BlockVerifier = verify_block,
        make_cache: Callable[..., ModelCache] = fastest_cache,
        make_draft_cache: Callable[..., ModelCache] | None = None,
    ):
        self.verifier = verifier
        self.make_cache = make_cache
        self.make_draft_cache = make_draft_cache or make_cache

    # -- steps -------------------------------------------------------------------------
    def draft_probs(self, logits: torch.Tensor, sampling: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
        """(distribution the draft samples from, distribution reported to the verifier as q)."""
        q = warp(logits, sampling)
        return q, q

    def propose(self, draft_cache: ModelCache, pending: torch.Tensor, k: int, sampling, generator):
        """Feed the pending token, then draft ``k`` tokens; the draft cache ends at ``+k`` positions minus d_k."""
        tokens, qs = [], []
        x = pending
        for _ in range(k):
            logits = draft_cache.feed(x)[:, -1]
            sample_probs, q = self.draft_probs(logits, sampling)
            token = _choose(sample_probs, sampling, generator)
            tokens.append(token)
            qs.append(q)
            x = token[:, None]
        return torch.stack(tokens, 1), torch.stack(qs, 1)

    def target_rows(self, logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
        """Target rows 0..k from the block forward of ``[pending, d_1..d_k]``: row i judges d_{i+1}."""
        return warp(logits, sampling)

    def repair(self, target_cache: ModelCache, draft_cache: ModelCache, drafts: torch.Tensor, new_len: int, fed_all: bool):
        """Make both caches hold exactly the committed tokens minus the new pending one (``new_len``)."""
        target_cache.commit(new_len)
        if fed_all:  # all k accepted: the draft never fed d_k
            draft_cache.feed(drafts[:, -1:])
        draft_cache.commit(new_len)

    def kept_in_cache(self, emitted: list[int], untruncated: list[int]) -> int:
        """How many of this round's tokens the caches must describe: the committed ones, never any after EOS."""
        return len(emitted)

    # -- loop ----------------------------------------------------------------------------
    def decode(
        self,
        target,
        draft,
        prompt,
        *,
        k: int,
        max_new_tokens: int,
        sampling: SamplingConfig = GREEDY,
        eos_id: int | None = None,
        generator: torch.Generator | None = None,
        on_round: RoundHook | None = None,
        timed: bool = False,
    ) -> DecodeResult:
        prompt = _validate_decode_args(target, draft, prompt, k, max_new_tokens, eos_id, sampling)
        t = prompt.shape[1]
        result = DecodeResult(tokens=[], prompt_len=t, finished_by="max_new_tokens")
        if max_new_tokens == 0:
            return result
        clock = time.perf_counter if timed else None
        seconds = {"prefill": 0.0, "draft": 0.0, "verify": 0.0, "repair": 0.0}
        tick = clock() if clock else 0.0
        # positions ever written: below t + max_new_tokens + k (the last pending token is never fed)
        needed = t + max_new_tokens + k
        target_cache, draft_cache = open_caches(self.make_cache, self.make_draft_cache, target, draft, prompt, needed, result)
        pending = prompt[:, -1:]
        committed = t
        if clock:
            seconds["prefill"] += clock() - tick
        while len(result.tokens) < max_new_tokens:
            remaining = max_new_tokens - len(result.tokens)
            k_round = min(k, remaining - 1)
            start = committed
            tick = clock() if clock else 0.0
            if k_round == 0:  # one token left: a plain target step
                draft_cache.feed(pending)
                result.draft_calls += 1
                logits = target_cache.feed(pending)
                result.target_calls += 1
                tokens = _choose(self.target_rows(logits, sampling)[:, -1], sampling, generator)[:, None]
                drafts = tokens[:, :0]
                m = torch.zeros_like(tokens[:, 0])
                if clock:
                    seconds["verify"] += clock() - tick
            else:
                drafts, qs = self.propose(draft_cache, pending, k_round, sampling, generator)
                result.draft_calls += k_round
                if clock:
                    now = clock()
                    seconds["draft"] += now - tick
                    tick = now
                logits = target_cache.feed(torch.cat([pending, drafts], 1))
                result.target_calls += 1
                rows = self.target_rows(logits, sampling)
                m, tokens = self.verifier(drafts, None if sampling.greedy else qs, rows, generator=generator, validate=False)
                if clock:
                    now = clock()
                    seconds["verify"] += now - tick
                    tick = now
            accepted, *row = torch.cat([m[:1, None], tokens[:1]], 1)[0].tolist()  # the one host sync of the round
            result.host_syncs += 1
            untruncated = [x for x in row if x >= 0]  # accepted drafts and the final token (none without a bonus)
            emitted, hit_eos = _truncate(untruncated, eos_id)
            kept = self.kept_in_cache(emitted, untruncated)
            committed += len(emitted)
            fed_all = k_round > 0 and kept == k_round + 1
            self.repair(target_cache, draft_cache, drafts, start + kept - 1, fed_all)
            result.draft_calls += int(fed_all)
            result.tokens.extend(emitted)
            pending = tokens[:, len(emitted) - 1 : len(emitted)]
            if clock:
                seconds["repair"] += clock() - tick
            if end_round(result, on_round, target_cache, draft_cache, start=start, proposed=k_round, accepted=accepted,
                         emitted=len(emitted), committed=committed, hit_eos=hit_eos):
                break
        if timed:
            result.seconds = seconds
        return result


def speculative_decode(target, draft, prompt, **kwargs) -> DecodeResult:
    """Speculative decoding with the reference verifier and cache (see :class:`SpeculativeDecoder`)."""
    return SpeculativeDecoder().decode(target, draft, prompt, **kwargs)
