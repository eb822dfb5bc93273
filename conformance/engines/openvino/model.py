"""A NumPy model of OpenVINO GenAI 2026.4's sampler, plain and speculative, on the exactly-known tables.

Read from ``openvinotoolkit/openvino.genai`` (``src/cpp/src/sampling/sampler.cpp``, ``logit_transformers.hpp``,
``logit_processor.hpp``, ``speculative_decoding/continuous_batching/pipeline_impl.cpp``; the mirror's master,
version line 2026.4.0, the installed wheel is 2026.4.1.0) and re-implemented step for step, its random numbers
included, so that it can be run on the same seeds as the engine (request by request) and on many more seeds (its
law). What it models:

* **the warper** (``LogitProcessor``): penalties (repetition over the prompt's and the generated ids, presence and
  frequency over the generated ids, all three *sign-dependent*: a negative logit moves toward 0), then top-k by a
  K-element min-heap over the ids in order (libstdc++'s heap; the kept tokens are left in heap order), temperature
  (a softmax, or deferred to the draw when only top-k is set), min-p, top-p (a stable sort by probability, cut
  once the running sum exceeds top-p); the draw scans the kept tokens in that order against ``total * u``;
* **the generator**: one ``std::mt19937(rng_seed)`` per request *and per pipeline*: the main (target) and the draft
  pipelines each create one from the same ``GenerationConfig.rng_seed``, so the draft's i-th uniform is the
  target's i-th uniform (:class:`Stream`: NumPy's MT19937 with the reference seeding, libstdc++'s
  ``generate_canonical<float>`` and ``uniform_int_distribution`` by Lemire's method);
* **speculative decoding with a draft model** (:func:`speculative`): the first token is the target's sample at
  prefill; then rounds of ``G = min(num_assistant_tokens, max_new_tokens - 1 - n)`` draft tokens (none once
  ``n >= max_new_tokens - 1``: the last token is the target's), drafted with the draft's warper (EOS ignored), and
  validated by ``Sampler::validate_candidate`` as written: for draft ``x`` at a position whose target law is ``p``
  the target *samples a fresh token* ``y ~ p``, draws ``r = U{0, 1, ..., 100} / 100`` and accepts ``x`` iff
  ``r <= q(x) / p(y)`` (the draft's probability of its own token over the target's probability of *another*
  token). On a rejection the replacement is the target's sample at the NEXT position, whose context holds the
  rejected ``x`` (``get_p_prime`` removes ``x`` but only rescales the sample's log-probability: no residual
  ``max(0, p - q)`` is ever sampled), and the round ends; after ``G`` acceptances the bonus is the target's sample
  after them;
* **the rounds' edges**: the draft stops drafting after a stop token (multistep's check ignores ``ignore_eos``);
  when the replacement equals the rejected draft the draft sees no new token and pauses for one step (a plain
  target step); a rejection of the LAST draft of a round leaves the target's KV cache a slot behind (the
  sampler's removed count is taken at offset 0, so the processed count is not rewound): the next input is read
  one past the end of the sequence's ids, NaN logits for a lone request, the sampler's uniform fallback, NaN in the
  cache from then on (in a batch the read is undefined: the model cannot follow it); with prefix caching the same
  state raises the block hash's ``content_length`` Check instead;
* **prompt lookup** (:func:`plain` covers it): ``validate_candidate`` with ``has_real_probabilities`` false
  accepts a draft iff it equals the target's own sample at that position and emits that sample otherwise, one
  uniform per position: the same tokens as plain sampling under the same seed.

Invariant: the model's plain sampler gives the engine's plain completions request for request on every case
tried (``engine_tests/test_openvino.py``, ``tests/test_openvino_adapter.py`` on recorded completions), its
speculative sampler the engine's first two tokens on >= 99.9% of the requests (the rest: float32 ties at r = 1)
and the whole completion wherever no undefined read intervened; the engine's speculative law is the model's
(:func:`conformance.engines.openvino.check.check`, ``python -m conformance.engines.openvino.check --check OUT``) where the exact law fails.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

__all__ = ["Stream", "Settings", "warp", "draw", "plain", "speculative", "law", "top_k_heap", "sample_law", "table_logits"]

F32 = np.float32


class Stream:
    """``std::mt19937(seed)`` with libstdc++'s float and int distributions (as the engine's sampler uses them)."""

    def __init__(self, seed: int):
        self.bg = np.random.MT19937(0)
        self.bg._legacy_seeding(int(seed) & 0xFFFFFFFF)  # init_genrand(seed): std::mt19937's seeding

    def u32(self) -> int:
        return int(self.bg.random_raw())

    def uniform(self) -> np.float32:
        """``std::uniform_real_distribution<float>(0, 1)``: ``generate_canonical<float, 24>`` from one 32-bit draw."""
        x = F32(self.u32()) / F32(4294967296.0)
        return np.nextafter(F32(1), F32(0)) if x >= F32(1) else x

    def int_0_100(self) -> int:
        """``std::uniform_int_distribution<int>(0, 100)``."""
        return self.int_below(101)

    def int_below(self, rng: int) -> int:
        """``std::uniform_int_distribution(0, rng - 1)`` on a 32-bit engine (libstdc++: Lemire's method)."""
        product = self.u32() * rng
        low = product & 0xFFFFFFFF
        if low < rng:
            threshold = (0x100000000 - rng) % rng
            while low < threshold:
                product = self.u32() * rng
                low = product & 0xFFFFFFFF
        return product >> 32


@dataclass(frozen=True)
class Settings:
    """One request's sampling settings as the engine reads them (0 / 1.0 / 1.0 / 0: off)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    greedy: bool = False

    @classmethod
    def of(cls, s) -> "Settings":
        """From a :class:`specdec_ref.warp.SamplingConfig`."""
        if s.greedy:
            return cls(greedy=True, repetition_penalty=float(s.repetition_penalty),
                       presence_penalty=float(s.presence_penalty), frequency_penalty=float(s.frequency_penalty))
        return cls(float(s.temperature), int(s.top_k or 0), float(s.top_p or 1.0), float(s.min_p or 0.0),
                   float(s.repetition_penalty), float(s.presence_penalty), float(s.frequency_penalty))


# ------------------------------------------------------------------------------------------- libstdc++'s heap
def _push_up(a, hole, top, value, less):
    parent = (hole - 1) // 2
    while hole > top and less(a[parent], value):
        a[hole] = a[parent]
        hole = parent
        parent = (hole - 1) // 2
    a[hole] = value


def _adjust(a, hole, length, value, less):
    top, second = hole, hole
    while second < (length - 1) // 2:
        second = 2 * (second + 1)
        if less(a[second], a[second - 1]):
            second -= 1
        a[hole] = a[second]
        hole = second
    if (length & 1) == 0 and second == (length - 2) // 2:
        second = 2 * (second + 1)
        a[hole] = a[second - 1]
        hole = second - 1
    _push_up(a, hole, top, value, less)


def _make_heap(a, less):
    n = len(a)
    if n < 2:
        return
    parent = (n - 2) // 2
    while True:
        _adjust(a, parent, n, a[parent], less)
        if parent == 0:
            return
        parent -= 1


def top_k_heap(logits: np.ndarray, k: int) -> list[tuple[float, int]]:
    """``TopKFilter::apply`` (fast path): the K kept (logit, id) pairs in the heap's order. Among tokens tied with
    the k-th logit, which are kept depends on the heap's order (often, not always, the lowest ids)."""
    less = lambda x, y: x[0] > y[0]  # the engine's min_cmp: a min-heap on the logit
    v = [(F32(logits[i]), i) for i in range(k)]
    _make_heap(v, less)
    for i in range(k, len(logits)):
        if F32(logits[i]) > v[0][0]:
            # pop_heap: the root goes to the back, the back is sifted down from the root; then the new one pushed
            back = v[k - 1]
            v[k - 1] = v[0]
            _adjust(v, 0, k - 1, back, less)
            v[k - 1] = (F32(logits[i]), i)
            _push_up(v, k - 1, 0, v[k - 1], less)
    return v


# ------------------------------------------------------------------------------------------- the warper, the draw
def _penalised(logits: np.ndarray, s: Settings, prompt: Sequence[int], generated: dict) -> np.ndarray:
    x = np.array(logits, dtype=F32)
    if s.repetition_penalty != 1.0:
        pen = F32(s.repetition_penalty)
        ids = set(prompt) | {t for t in generated}
        for t in sorted(ids):
            x[t] = x[t] / pen if x[t] >= 0 else x[t] * pen
    if s.presence_penalty:
        for t in sorted(generated):
            x[t] = x[t] - F32(s.presence_penalty) if x[t] >= 0 else x[t] + F32(s.presence_penalty)
    if s.frequency_penalty:
        for t, c in sorted(generated.items()):
            x[t] = x[t] - F32(s.frequency_penalty * c) if x[t] >= 0 else x[t] + F32(s.frequency_penalty * c)
    return x


def _insertion_sort_desc(items: list, key) -> list:
    """libstdc++'s ``std::sort`` on <= 16 elements is an insertion sort: stable, and a NaN never moves."""
    a = list(items)
    for i in range(1, len(a)):
        v, j = a[i], i
        while j > 0 and key(v) > key(a[j - 1]):
            a[j] = a[j - 1]
            j -= 1
        a[j] = v
    return a


def warp(logits: np.ndarray, s: Settings, prompt: Sequence[int] = (), generated: dict | None = None):
    """:func:`warp_uncached`, memoised on the logits' bytes, the settings and the penalties' history."""
    pen = s.repetition_penalty != 1.0 or s.presence_penalty or s.frequency_penalty
    key = (np.asarray(logits, dtype=F32).tobytes(), s, tuple(prompt) if pen else (),
           tuple(sorted((generated or {}).items())) if pen else ())
    hit = _WARPS.get(key)
    if hit is None:
        hit = _WARPS[key] = warp_uncached(logits, s, prompt, generated)
        if len(_WARPS) > 200_000:
            _WARPS.clear()
    return hit


_WARPS: dict = {}


def warp_uncached(logits: np.ndarray, s: Settings, prompt: Sequence[int] = (), generated: dict | None = None):
    """The engine's kept tokens and their weights, in the order the draw scans them: ``(ids, weights, deferred)``
    (``deferred``: weights are logits / T, the draw exponentiates; else probabilities, possibly summing below 1).
    NaN logits (an input id read past the end of the sequence: :func:`speculative`) go through the same steps, as
    the engine's comparisons treat them (every comparison with NaN is false)."""
    x = _penalised(logits, s, prompt, generated or {})
    if s.greedy:
        i = int(np.argmax(x))
        return [i], np.array([1.0], dtype=F32), False
    V = len(x)
    top_k = s.top_k if 0 < s.top_k < V else 0
    deferred = bool(top_k) and s.top_p == 1.0 and s.min_p == 0.0
    if top_k:
        kept = top_k_heap(x, top_k)
        ids, vals = [i for _, i in kept], np.array([v for v, _ in kept], dtype=F32)
    else:
        ids, vals = list(range(V)), x.copy()
    if deferred:
        if s.temperature != 1.0:
            vals = (vals * (F32(1.0) / F32(s.temperature))).astype(F32)
        return ids, vals, True
    m = vals[0]
    for v in vals[1:]:
        if v > m:
            m = v
    with np.errstate(invalid="ignore"):
        e = np.exp((vals - m) * (F32(1.0) / F32(s.temperature))) if s.temperature != 1.0 else np.exp(vals - m)
    e = e.astype(F32)
    total = F32(0)
    for w in e:
        total = F32(total + w)
    with np.errstate(invalid="ignore"):
        p = (e / total).astype(F32)
    if s.min_p > 0.0:
        best, arg = F32(0), 0
        for j in range(len(p)):
            if p[j] > best:
                best, arg = p[j], j
        thr = F32(s.min_p) * best
        keep = [j for j in range(len(p)) if p[j] >= thr] or [arg]
        ids, p = [ids[j] for j in keep], p[keep]
    if s.top_p != 1.0:
        order = _insertion_sort_desc(range(len(p)), key=lambda j: p[j])
        acc, n = F32(0), 0
        for j in order:
            acc = F32(acc + p[j])
            n += 1
            if acc > F32(s.top_p):
                break
        ids, p = [ids[j] for j in order[:n]], p[order[:n]]
    return ids, p, False


def draw(w, stream: Stream) -> tuple[int, float]:
    """``Sampler::_multinomial_sample`` on a warp, drawing from ``stream``: (token, its log-probability as the
    engine stores it, float32). Its defensive fallback when the weights are NaN (or all zero) is uniform over the
    kept tokens: a float draw on the deferred (top-k only) path, an integer draw ``uniform_int_distribution(0,
    n - 1)`` on the others."""
    ids, vals, deferred = w
    if deferred:
        m = vals[0]
        for v in vals[1:]:
            if v > m:
                m = v
        with np.errstate(invalid="ignore"):
            weights = np.exp(vals - m).astype(F32)
        total = F32(0)
        for x in weights:
            total = F32(total + x)
        fallback = not (total > 0 and np.isfinite(total))
        if fallback:
            weights, total = np.ones(len(ids), dtype=F32), F32(len(ids))
        log_total = np.log(total) + (F32(0) if fallback else m)
    else:
        weights = vals
        total = F32(0)
        for x in weights:
            total = F32(total + x)
        if not (total > 0 and np.isfinite(total)):
            return ids[stream.int_below(len(ids))], F32(np.log(F32(1.0) / F32(len(ids))))
        log_total = np.log(total)
    r = F32(total * stream.uniform())
    run, pick = F32(0), len(ids) - 1
    for j, x in enumerate(weights):
        run = F32(run + x)
        if run > r:
            pick = j
            break
    if deferred:
        lp = F32(np.log(F32(1.0) / F32(len(ids)))) if fallback else F32(vals[pick] - log_total)
    else:
        lp = F32(np.log(weights[pick]) - log_total)
    return ids[pick], lp


def probabilities(w, vocab: int) -> np.ndarray:
    """The warp as a float64 law over the vocabulary (what :func:`draw` samples; uniform over the kept if NaN)."""
    ids, vals, deferred = w
    weights = np.exp(vals.astype(np.float64) - np.nanmax(vals)) if deferred else vals.astype(np.float64)
    if not np.all(np.isfinite(weights)) or weights.sum() <= 0:
        weights = np.ones(len(ids))
    out = np.zeros(vocab)
    out[ids] = weights / weights.sum()
    return out


# ------------------------------------------------------------------------------------------- requests
Logits = Callable[[Sequence[int]], np.ndarray]


def _stop(t: int, eos_id: int | None) -> bool:
    return eos_id is not None and t == eos_id


def plain(target: Logits, prompt, s: Settings, max_new: int, seed: int, *, eos_id: int | None = None) -> list[int]:
    """One request of plain sampling (and of prompt lookup: sample-and-match gives the same tokens)."""
    st, out, hist = Stream(seed), [], Counter()
    while len(out) < max_new:
        w = warp(target(list(prompt) + out), s, prompt, hist)
        t = w[0][0] if s.greedy else draw(w, st)[0]
        out.append(t)
        hist[t] += 1
        if _stop(t, eos_id):
            break
    return out


NAN = None  # an input id read past the end of the sequence's ids: the model's logits are NaN from there on


def speculative(target: Logits, draft: Logits, prompt, s: Settings, max_new: int, seed: int, k: int, *,
                eos_id: int | None = None, stop_id: int | None = 7, trace: list | None = None) -> list[int]:
    """One request of draft-model speculative sampling as OpenVINO GenAI runs it (see the module docstring).

    The target's KV cache is followed slot by slot (``slots``: the input id each generated position was computed
    from, :data:`NAN` once an input was read past the end): after a step the sequence group's processed count is
    rewound only when the sampler reports removed tokens (``max_removed_tokens_per_request``), which a rejection
    of the LAST draft of a round never does (the count is taken at the bonus position, offset 0). The rejected
    draft then stays in the cache and every later input is read one slot late, the last one past the end of the
    ids (``model_runner.hpp``: ``get_generated_ids()[position_id - prompt_len]``): NaN logits, the sampler's
    uniform fallback, NaN in the cache for the rest of the request. (With prefix caching on, the same state fails
    the block hash's ``content_length <= prompt_ids.size() + m_generated_ids.size()`` check instead.)"""
    main, aux = Stream(seed), Stream(seed)  # two pipelines, one seed: the draft's stream IS the target's stream
    prompt = list(prompt)
    gen: list[int] = []
    slots: list = []  # the target's KV cache beyond the prompt: the input id of each processed generated position
    hist = Counter()  # the target's penalty history (what its logit processor registered)

    def rows(inputs: list) -> list:
        """The target's logits for a step that feeds ``inputs`` after ``slots`` (NaN after any NaN input)."""
        out, ctx, poisoned = [], list(slots), NAN in slots
        for x in inputs:
            ctx.append(x)
            poisoned = poisoned or x is NAN
            out.append(np.full(8, np.nan, dtype=F32) if poisoned else target(prompt + ctx))
        return out

    def sample(logits):
        return draw(warp(logits, s, prompt, hist), main)

    t, _ = sample(target(prompt))  # the first token: the target at prefill (the draft is paused)
    gen.append(t)
    hist[t] += 1
    draft_paused = False
    while len(gen) < max_new and not _stop(gen[-1], eos_id):
        n = len(gen)
        G = 0 if n >= max_new - 1 or draft_paused else min(k, max_new - 1 - n)
        draft_paused = False
        drafts, qs, dhist = [], [], Counter(hist)
        for _ in range(G):  # the draft (its own KV cache is kept right) runs with ignore_eos, yet pauses
            x, qx = draw(warp(draft(prompt + gen + drafts), s, prompt, dhist), aux)
            drafts.append(x)
            qs.append(qx)
            dhist[x] += 1
            if stop_id is not None and x == stop_id:  # after a stop token (multistep's stop-token check)
                break
        G = len(drafts)
        seq = gen + drafts
        inputs = [seq[i] if i < len(seq) else NAN for i in range(len(slots), len(slots) + G + 1)]
        logits = rows(inputs)
        removed, j = 0, 0
        while j < G:  # validate_candidate
            y, py = sample(logits[j])
            r = F32(main.int_0_100()) / F32(100)
            ok = bool(r <= F32(np.exp(qs[j]) / np.exp(py)))  # p_i / q_i of the stored log-probabilities
            if trace is not None:
                trace.append(("validate", len(gen) + 1, drafts[j], y, float(r), float(np.exp(qs[j])),
                              float(np.exp(py)), ok))
            if not ok:
                break
            gen.append(drafts[j])
            hist[drafts[j]] += 1
            if _stop(drafts[j], eos_id):
                removed = G - j - 1  # the trailing drafts after an accepted stop token
                j = G + 1
                break
            j += 1
        if j < G:  # rejected: the replacement is the next row's sample (the rejected draft in its context)
            z, _ = sample(logits[j + 1])
            if trace is not None:
                trace.append(("replace", len(gen) + 1, drafts[j], z))
            gen.append(z)
            hist[z] += 1
            removed = G - (j + 1)  # the offset of the row that sampled z: 0 when the last draft was rejected
            # the draft compares its ids with the target's: a replacement equal to the rejected draft is no new
            # token to it (inserted 0), and update_request pauses it for the next step: a plain target step
            draft_paused = z == drafts[j]
        elif j == G:  # every draft accepted (or G = 0): the bonus from the last row
            z, _ = sample(logits[G])
            gen.append(z)
            hist[z] += 1
        if removed:
            slots = (slots + inputs)[: len(gen) - 1]  # rewound to the last kept token
        else:
            slots = slots + inputs
    return gen[:max_new]


def sample_law(run: Callable[[int], list[int]], seeds: Sequence[int], length: int, eos_id: int | None) -> dict:
    """Empirical law of the first ``length`` tokens (cut after EOS) over ``seeds``: ``{"a b": probability}``."""
    c = Counter()
    for sd in seeds:
        seq = []
        for t in run(sd)[:length]:
            seq.append(t)
            if _stop(t, eos_id):
                break
        c[" ".join(map(str, seq))] += 1
    n = sum(c.values())
    return {key: v / n for key, v in c.items()}


def table_logits(name: str):
    """``ctx -> float32 logits`` of the exactly-known checkpoint ``name`` at that context (from its tables, memoised
    per context)."""
    from specdec_ref.exact import exact_model

    em, cache = exact_model(name), {}

    def f(ctx):
        key = tuple(ctx)
        if key not in cache:
            cache[key] = em.next_logits([list(ctx)])[0].numpy().astype(F32)
        return cache[key]
    return f


def law(target_name: str, draft_name: str, prompt, sampling, max_new: int, k: int, *, length: int,
        eos: bool, n: int = 200_000, seed_base: int = 10_000_000) -> dict:
    """The mechanism's law of the first ``length`` tokens for a case (Monte Carlo over ``n`` seeds the matrix never
    uses): what the engine's speculative completions follow."""
    from specdec_ref.exact import exact_model

    eos_id = int(exact_model(target_name).eos_id) if eos else None
    s = Settings.of(sampling)
    T, D = table_logits(target_name), table_logits(draft_name)
    return sample_law(lambda sd: speculative(T, D, prompt, s, max_new, sd, k, eos_id=eos_id),
                      range(seed_base, seed_base + n), length, eos_id)
