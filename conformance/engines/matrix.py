"""The engine certification matrix as data: sampling cases, the configuration record, the efficiency request set.

Engine-neutral: nothing here imports an engine, and every adapter (:mod:`conformance.engines.adapter`) draws its
cases from :data:`CASES` (an engine may leave some out: a setting it cannot express, a convention it does not
state) and the request-feature cases it names from :data:`FEATURE_CASES`. A *configuration* is one engine set-up (speculative method and its options, the scheme it declares); a
*case* is one sampling setting on one prompt of one exactly-known target, certified by
``conformance.samples.certify_samples``. Invariant: every case's law is determined by its settings (no top-p cut
inside a tie group; ``tests/test_engine_runner.py`` checks it), and every request of a case has its own seed when
the case is seeded, so a case's JSONL is a valid black-box file.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from specdec_ref.automaton import TokenAutomaton
from specdec_ref.warp import SamplingConfig

__all__ = ["K", "Case", "Configuration", "CASES", "FEATURE_CASES", "FAMILIES", "EFFICIENCY", "Efficiency", "case",
           "SCHEMES", "law_depends_on_tie_rule"]

#: Draft tokens per round in every speculative configuration.
K = 3
#: Exact pair per target family: the target the engine loads and the draft model of ``draft_model`` methods.
FAMILIES = {"order1": "order1-close", "order2": "order2-order1", "long": "long-close"}


@dataclass(frozen=True)
class Case:
    """One sampling setting: ``n`` requests of ``prompt`` on the ``family``'s target, ``max_new_tokens`` each."""

    name: str
    family: str
    prompt: tuple[int, ...]
    sampling: SamplingConfig
    max_new_tokens: int
    eos: bool  # stop at the model's EOS (else ignore_eos: EOS is an ordinary token)
    seeded: bool
    n: int
    exercises: str
    seed_base: int = 0
    condition: str | None = None  # a serving condition's case (:mod:`conformance.engines.conditions`)
    extra_prompts: tuple[tuple[int, ...], ...] = ()  # further prompts: request i uses prompts[i % len(prompts)]
    logprobs: int | None = None  # top-n log-probabilities asked per token (:mod:`conformance.engines.logprobs`)
    samples: int = 1  # completions per request (the API's n): ``n`` counts completions, n / samples requests
    stops: tuple[str, ...] = ()  # stop strings; "{p}" stands for the engine's token prefix (Conventions.token_prefix)
    stream: bool = False  # the engine streams the completion; the record is the chunks' tokens and text put together
    token_prefix: str | None = None  # the engine's token prefix, set by Conventions.under (None: the template as is)
    same_seeds_as: str | None = None  # a case whose requests this one repeats seed for seed (per seed identical)
    shifted: bool = False  # generated past the checkpoint's positions by an engine that shifts its context: the law is
    # the order-1 table's at any length (``specdec_ref.exact.registry.ExactModel.shifted``: the model ``NAME+shift``)
    pooled: bool = False  # many distinct prompts ending in few table cells: the full-law tests pool them by cell
    # (``certify_samples(pool_prompts=True)``)
    after: str | None = None  # a case of the same worker whose requests each wave sends first, in a batch of their
    # own (the previous turn of a conversation: this case's prompts continue its completions)

    def __post_init__(self):
        if self.samples < 1 or self.n % self.samples:
            raise ValueError(f"case {self.name!r}: samples must be >= 1 and divide n ({self.n}), got {self.samples}")
        if (self.stops or self.stream) and not self.eos:
            raise ValueError(f"case {self.name!r}: stop strings and streaming are cased with EOS on (the EOS token then "
                             "renders as nothing in every engine)")

    @property
    def texts(self) -> bool:
        """Whether the case asks for the generated text (stop strings, streaming) and checks it against the tokens."""
        return bool(self.stops) or self.stream

    def stop_rule(self):
        """The case's stop strings on its model's vocabulary under the engine's token prefix
        (:class:`specdec_properties.stops.StopStrings`; None when the case asks for no text)."""
        if not self.texts:
            return None
        if self.token_prefix is None:
            raise ValueError(f"case {self.name!r}: its stop strings are a template until an engine's token prefix is "
                             "set (Conventions.under)")
        from specdec_properties.stops import StopStrings
        from specdec_ref.exact import exact_model

        return StopStrings.for_model(exact_model(self.model), self.stops, self.token_prefix)

    @property
    def prompts(self) -> tuple[tuple[int, ...], ...]:
        return (self.prompt,) + self.extra_prompts

    def prompt_of(self, i: int) -> tuple[int, ...]:
        """The prompt of request ``i`` (the prompts in turn)."""
        return self.prompts[i % len(self.prompts)]

    @property
    def group(self) -> str:
        """The worker a case runs in: its target family, or ``family@condition`` (a condition's engine settings
        apply to one engine load)."""
        return self.family if self.condition is None else f"{self.family}@{self.condition}"

    @property
    def model(self) -> str:
        from specdec_ref.exact import SHIFTED

        return {"order1": "order1-target", "order2": "order2-target", "long": "long-target"}[self.family] + (
            SHIFTED if self.shifted else "")

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    def seed(self, i: int) -> int | None:
        """Request ``i``'s seed: ``seed_base + i * samples`` (room for engines that seed a request's j-th completion
        with ``seed + j``, as vLLM does: no two completions of a case share a seed)."""
        return self.seed_base + i * self.samples if self.seeded else None

    def settings(self) -> str:
        s = self.sampling
        if s.greedy:
            parts = ["greedy"]
        else:
            parts = [f"T {s.temperature:g}"]
            parts += [f"top-k {s.top_k}"] if s.top_k else []
            parts += [f"top-p {s.top_p:g}"] if s.top_p else []
            parts += [f"min-p {s.min_p:g}"] if s.min_p else []
        parts += [f"rep {s.repetition_penalty:g}"] if s.repetition_penalty != 1.0 else []
        parts += [f"pres {s.presence_penalty:g}"] if s.presence_penalty else []
        parts += [f"freq {s.frequency_penalty:g}"] if s.frequency_penalty else []
        parts += ["bias " + " ".join(f"{t}:{b:+g}" for t, b in s.logit_bias)] if s.logit_bias else []
        parts += [f"min tokens {s.min_new_tokens}"] if s.min_new_tokens else []
        parts += [f"grammar ({s.constraint.num_states} states)"] if s.constraint is not None else []
        parts += ["bad words " + ", ".join(" ".join(str(t) for t in w) for w in s.bad_words)] if s.bad_words else []
        parts += [f"logprobs top-{self.logprobs}"] if self.logprobs else []
        parts += [f"n {self.samples} per request"] if self.samples > 1 else []
        parts += ["stop " + " ".join(repr(s) for s in self.stops)] if self.stops else []
        parts += ["streamed"] if self.stream else []
        parts.append(f"max {self.max_new_tokens}" + (", EOS" if self.eos else ", no EOS"))
        parts.append("seeded" if self.seeded else "unseeded")
        if len(self.prompts) > 1:
            parts.append(f"{len(self.prompts)} prompts of {min(map(len, self.prompts))}-{max(map(len, self.prompts))} tokens")
        return ", ".join(parts)


N = 20000  # per sampling case: power 0.99 against TV 0.03 at alpha 1e-6 on the first 1-4 tokens (the tool states it)
G = 200  # greedy: every completion is checked token for token

#: The structured-output case's grammar over the order-1 vocabulary (t0 ... t6, EOS 7), as a token automaton: in
#: state 0, t0 t1 t2 and EOS keep it, t3 moves to state 1; in state 1 only t4 t5 t6 are allowed (no EOS), each back
#: to state 0. As a regular expression on the tokens' text: ``(t0|t1|t2|t3(t4|t5|t6))*``.
GRAMMAR = TokenAutomaton(((0, 0, 0, 1, -1, -1, -1, 0), (-1, -1, -1, -1, 0, 0, 0, -1)))

#: The bad-words case's words (token ids; vLLM takes them as text, ``t0 t0`` and ``t1 t2 t1``): the rule reads the
#: generated tokens only, drafts earlier in a block included; the prompt (``[2, 5]``: two tokens, so that vLLM's
#: defect C, a one-token prompt's first token, stays out of it) ends with no word's beginning.
BAD_WORDS = ((0, 0), (1, 2, 1))

CASES: tuple[Case, ...] = (
    Case("temperature", "order1", (0, 3), SamplingConfig(temperature=0.6), 3, False, False, N,
         "temperature alone, unseeded (the engine's global generator), EOS an ordinary token", 0),
    Case("warp-1tok", "order1", (6,), SamplingConfig(temperature=1.5, top_k=4, top_p=0.6), 3, True, True, N,
         "warper order (temperature before top-k / top-p) on a ONE-token prompt", 100_000),
    Case("warp", "order1", (2, 6), SamplingConfig(temperature=1.5, top_k=4, top_p=0.6), 3, True, True, N,
         "the same law as warp-1tok (order1 reads the last token) from a two-token prompt", 200_000),
    Case("ties", "order1", (0, 4), SamplingConfig(temperature=1.5, top_k=2), 3, True, True, N,
         "exact ties at the top-k boundary (rows 5 and 7 keep three tokens under the keep-all-ties rule)", 300_000),
    Case("eos", "order1", (3, 1), SamplingConfig(temperature=0.7, top_k=2), 4, True, True, N,
         "EOS accepted inside a block, nothing after it", 400_000),
    Case("min-p", "order1", (5, 2), SamplingConfig(temperature=1.0, min_p=0.2), 3, True, True, N,
         "min_p (vLLM warns at start-up that min_p does not work with speculative decoding)", 500_000),
    Case("penalty", "order1", (4, 5, 0), SamplingConfig(temperature=0.6, repetition_penalty=1.5, presence_penalty=0.5),
         3, True, True, N, "repetition (prompt + output) and presence (output) penalties on each draft's own history",
         600_000),
    Case("position-1tok", "order2", (6,), SamplingConfig(temperature=1.0, top_k=2, top_p=0.9), 3, True, True, N,
         "order-2 + position target from the one-token prompt [<bos>]: KV cache and positions", 700_000),
    Case("position", "order2", (6, 0), SamplingConfig(temperature=1.0, top_k=2, top_p=0.9), 3, True, True, N,
         "order-2 + position target from [<bos>, 0]: KV cache, positions, rollback", 800_000),
    Case("greedy-1tok", "order1", (6,), SamplingConfig(greedy=True), 4, True, True, G,
         "greedy, token for token, one-token prompt", 900_000),
    Case("greedy", "order2", (6, 0), SamplingConfig(greedy=True), 4, True, True, G,
         "greedy, token for token, order-2 target", 910_000),
)

#: Request features beyond the sampling settings (logit bias, ...): an engine runs one only where its adapter names it
#: in ``cases`` (they are not in :data:`CASES`, the default set). A feature the engine accepts and does not apply is
#: NOT CERTIFIED with the setting named (:data:`conformance.samples.conventions.IGNORABLE`).
FEATURE_CASES: tuple[Case, ...] = (
    Case("logit-bias", "order1", (2, 5), SamplingConfig(temperature=1.0, logit_bias={2: 1.0, 5: -1.0}), 3, False, True,
         N, "logit_bias on every position, drafts included (ignored: TV 0.225 over the three tokens, 0.031 on the "
         "first alone)", 1_000_000),
    Case("min-tokens", "order1", (2, 6), SamplingConfig(temperature=1.0, min_new_tokens=3), 4, True, True, N,
         "EOS masked before the third token, drafts included (ignored: TV 0.272; EOS is 0.27 likely in the first three)",
         1_100_000),
    Case("frequency", "order1", (4, 5, 0), SamplingConfig(temperature=0.8, frequency_penalty=1.0), 3, False, True, N,
         "frequency penalty counting each output token, drafts before it included (ignored: TV 0.434; counted once, "
         "as a presence penalty: TV 0.102)", 1_200_000),
    Case("logprobs", "order2", (6, 0, 3), SamplingConfig(temperature=0.8), 4, True, True, N // 4,
         "log-probabilities of every returned token and its top 3 (and of the prompt's tokens), drafted tokens "
         "included, against the exact values at the same prefix (deterministic: every token of every request); the "
         "law with them asked at a quarter of the sample (reduced power)", 1_300_000, logprobs=3),
    Case("n-samples", "order2", (6, 0), SamplingConfig(temperature=1.0), 3, True, True, N,
         "four completions per request (n = 4), pooled as independent samples: completions that share their "
         "randomness (copies of one another) inflate every cell's variance four-fold", 1_400_000, samples=4),
    Case("stop-strings", "order1", (0,), SamplingConfig(temperature=1.0), 5, True, True, N,
         "stop strings: one token ('t5', 17 % of completions stop there), one spanning two tokens ('2{p}t1', 16 %), "
         "and a pair where the later-listed completes first ('t6' before 't6{p}t4', 9 %); stops at every position "
         "1-5, the last at max_tokens (7.5 %). Token ids past the stop are impossible events (tokens of an accepted "
         "block kept past it; the first-listed string winning: 5.7 % of completions), the returned text must be the "
         "tokens' rendering cut before the stop, finish_reason 'stop' (also at max_tokens)", 1_500_000,
         stops=("t6{p}t4", "2{p}t1", "t5", "t6")),
    Case("stop-stream", "order1", (0,), SamplingConfig(temperature=1.0), 5, True, True, N // 4,
         "stop-strings streamed: the chunks' tokens and text put together must be the completion and its text (a "
         "multi-token step streamed as its last token only, text held back for a partial stop string and never "
         "sent), and per seed the non-streamed completion (the same seeds as stop-strings); the law at a quarter of "
         "the sample (reduced power)", 1_500_000, stops=("t6{p}t4", "2{p}t1", "t5", "t6"), stream=True,
         same_seeds_as="stop-strings"),
    Case("grammar", "order1", (3,), SamplingConfig(temperature=1.0, constraint=GRAMMAR), 5, True, True, N,
         "structured output (a grammar, GRAMMAR): the allowed tokens change after t3 (77 % of completions hold a t3 "
         "before their last token, often inside a draft block) and EOS is allowed only in the first state (30 % end "
         "there). A token the grammar forbids is an impossible event (drafts checked against the block's first "
         "state; the grammar not advanced over accepted drafts); ignored, the law departs by TV 0.78", 1_600_000),
    Case("bad-words", "order1", (2, 5), SamplingConfig(temperature=1.0, bad_words=BAD_WORDS), 5, True, True, N,
         "bad words (BAD_WORDS): t0 never right after a generated t0 (60 % of free completions hold 't0 t0'), t1 never "
         "after a generated 't1 t2' (a three-token word; banning t1 after any t2 departs by TV 0.16, dropping the word "
         "by TV 0.06). A completion holding a word is an impossible event (the ban read off the committed tokens "
         "only, drafts earlier in the block ignored); ignored, the law departs by TV 0.63", 1_700_000),
)


#: Schemes a configuration may declare: the exact acceptance law its efficiency is checked against.
#: ``token``: token-wise rejection sampling with the draft's law; ``one_hot``: rejection sampling of one-hot
#: (argmax) drafts; ``block``: block verification; ``sample_match``: the target samples with the request's own
#: generator and a draft is kept while it equals the target's sample (lossless and, per seed, identical to no
#: speculation); ``synthetic``: fixed acceptance rates (lossy by design); None: no exact law stated.
SCHEMES = ("token", "one_hot", "block", "sample_match", "synthetic", None)


@dataclass(frozen=True)
class Configuration:
    """One engine set-up.

    ``method``: the engine's own name for its speculative method (None: no speculation); ``options``: the
    engine's settings for it (the adapter reads them); ``scheme``: the exact law it claims (:data:`SCHEMES`);
    ``cases``: the case names it runs (None: every case of the adapter); ``lossy``: lossy by design, the harness
    must reject it; ``identical_to``: a configuration whose outputs this one claims to equal request by request
    under the same seeds (checked per seed: stronger than the law test); ``k``: drafts per round (None: the
    adapter's default); ``scale``: the fraction of every case's requests this configuration runs (below 1 only with
    ``identical_to``: per-seed identity on the first requests of each case is then the evidence, and their law is
    tested at the reduced power it has); ``proposer``: the exact law of the configuration's argmax drafts
    (:func:`conformance.engines.rounds.proposal_law`: ``draft``, ``exact-eagle``, ``exact-medusa:H``, ``exact-eagle3``,
    ``ngram:MIN:MAX``): its rounds are rebuilt from the efficiency set's completions and compared with the engine's
    counters, and (other than ``draft``) its efficiency expectation is the exact one given those rounds;
    ``sampled_proposer``: the exact law a ``token``-scheme configuration samples its drafts from (the same names as
    ``proposer``): the engine's per-request rounds place every round in its completion, and the acceptance per
    position is tested against the exact expectation given those rounds' texts
    (:func:`conformance.engines.sampled_rounds.sampled_rounds_of`); ``efficiency``: False for a configuration that repeats
    another's speculative set-up with one engine setting changed that cannot touch acceptance (its efficiency is that
    configuration's), so its worker does not rerun the efficiency set."""

    name: str
    method: str | None
    options: dict = field(default_factory=dict)
    scheme: str | None = None
    cases: tuple[str, ...] | None = None
    lossy: bool = False
    note: str = ""
    identical_to: str | None = None
    k: int | None = None
    scale: float = 1.0
    proposer: str | None = None
    sampled_proposer: str | None = None
    efficiency: bool = True  # runs the efficiency request set (False: another configuration's set-up, one setting changed)
    #: Under a serving condition, the condition's knobs this configuration changes (``{"prefix_caching": False}``: the
    #: cold run the cached runs are compared with per seed; :func:`conformance.engines.conditions.under`).
    condition_settings: dict = field(default_factory=dict)
    #: Under a serving condition, the configuration this one claims to equal per seed there, instead of
    #: ``identical_to`` (the control against the same engine with the condition's cache off).
    condition_identical_to: str | None = None

    def __post_init__(self):
        if self.scheme not in SCHEMES:
            raise ValueError(f"configuration {self.name!r}: unknown scheme {self.scheme!r}; known: {SCHEMES}")
        if not 0 < self.scale <= 1 or (self.scale < 1 and self.identical_to is None):
            raise ValueError(f"configuration {self.name!r}: scale must be in (0, 1], and below 1 only with identical_to")
        if self.method is None and (self.scheme is not None or self.proposer is not None):
            raise ValueError(f"configuration {self.name!r}: a scheme or a proposer needs a speculative method")
        if self.proposer is not None and self.scheme not in ("one_hot", "sample_match"):
            raise ValueError(f"configuration {self.name!r}: a declared proposer drafts its argmax (scheme one_hot, or "
                             f"sample_match: the same acceptance for an argmax draft)")
        if self.sampled_proposer is not None and (self.scheme != "token" or self.proposer is not None):
            raise ValueError(f"configuration {self.name!r}: a sampled proposer is judged token-wise (scheme token, no "
                             f"argmax proposer)")

    @property
    def speculative(self) -> bool:
        return self.method is not None


@dataclass(frozen=True)
class Efficiency:
    """The request set whose counters are compared with the exact expectation (order1 pair: a Markov chain)."""

    family: str = "order1"
    sampling: SamplingConfig = SamplingConfig(temperature=0.7)
    prompts: tuple[tuple[int, ...], ...] = tuple((5, a) for a in range(7))
    n: int = 4200
    max_new_tokens: int = 10
    seed_base: int = 5_000_000


EFFICIENCY = Efficiency()


def case(name: str) -> Case:
    for c in CASES + FEATURE_CASES:
        if c.name == name:
            return c
    raise KeyError(f"unknown case {name!r}; known: {', '.join(c.name for c in CASES + FEATURE_CASES)}")


@functools.lru_cache(maxsize=None)
def law_depends_on_tie_rule(c: Case) -> bool:
    """Whether the case's exact law changes with the top-k tie rule (its top-k cuts a tie group on a row it visits,
    directly or through a top-p taken over the kept set): computed from the tables, never marked by hand."""
    if c.greedy or not c.sampling.top_k:
        return False
    from dataclasses import replace

    from specdec_properties.sequences import continuation_law
    from specdec_ref.exact import exact_model

    em = exact_model(c.model)
    eos = int(em.eos_id) if c.eos else None
    laws = [continuation_law(em, list(c.prompt), c.max_new_tokens, replace(c.sampling, top_k_ties=rule), eos_id=eos)
            for rule in ("all", "lowest_ids")]
    return max(abs(float(laws[0].get(x, 0.0)) - float(laws[1].get(x, 0.0))) for x in set(laws[0]) | set(laws[1])) > 1e-12
