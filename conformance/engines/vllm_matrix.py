"""The vLLM certification matrix as data: configurations, sampling cases, the efficiency request set.

Nothing here imports vLLM. A *configuration* is one engine set-up (speculative method and its options);
a *case* is one sampling setting on one prompt of one exactly-known target, certified by
``conformance.samples.certify_samples``. Invariant: every case's law is determined by its settings (no
top-p cut inside a tie group; ``tests/test_vllm_runner.py`` checks it), and every request of a case has
its own seed when the case is seeded, so a case's JSONL is a valid black-box file.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specdec_ref.warp import SamplingConfig

__all__ = [
    "K", "Case", "Configuration", "CASES", "CONFIGS", "FAMILIES", "EFFICIENCY", "Efficiency",
    "case", "config", "vllm_sampling_kwargs", "speculative_config", "cases_for",
]

#: Draft tokens per round in every speculative configuration.
K = 3
#: Exact pair per target family: the target the engine loads and the draft model of ``draft_model`` methods.
FAMILIES = {"order1": "order1-close", "order2": "order2-order1"}


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

    @property
    def model(self) -> str:
        return {"order1": "order1-target", "order2": "order2-target"}[self.family]

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    def seed(self, i: int) -> int | None:
        return self.seed_base + i if self.seeded else None

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
        parts.append(f"max {self.max_new_tokens}" + (", EOS" if self.eos else ", no EOS"))
        parts.append("seeded" if self.seeded else "unseeded")
        return ", ".join(parts)


N = 20000  # per sampling case: power 0.99 against TV 0.03 at alpha 1e-6 on the first 1-4 tokens (the tool states it)
G = 200  # greedy: every completion is checked token for token

CASES: tuple[Case, ...] = (
    Case("temperature", "order1", (0, 3), SamplingConfig(temperature=0.6), 3, False, False, N,
         "temperature alone, unseeded (the engine's global generator), EOS an ordinary token", 0),
    Case("warp-1tok", "order1", (6,), SamplingConfig(temperature=1.5, top_k=4, top_p=0.6), 3, True, True, N,
         "warper order (temperature before top-k / top-p) on a ONE-token prompt", 100_000),
    Case("warp", "order1", (2, 6), SamplingConfig(temperature=1.5, top_k=4, top_p=0.6), 3, True, True, N,
         "the same law as warp-1tok (order1 reads the last token) from a two-token prompt", 200_000),
    Case("ties", "order1", (0, 4), SamplingConfig(temperature=1.5, top_k=2), 3, True, True, N,
         "exact ties at the top-k boundary (rows 5 and 7 keep three tokens)", 300_000),
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


@dataclass(frozen=True)
class Configuration:
    """One engine set-up. ``scheme``: the exact acceptance law it claims (None: no exact law stated)."""

    name: str
    method: str | None  # vLLM speculative method; None = no speculation
    options: dict = field(default_factory=dict)
    scheme: str | None = None  # token | one_hot | block | synthetic | None
    cases: tuple[str, ...] | None = None  # None: every case
    lossy: bool = False
    note: str = ""


CONFIGS: tuple[Configuration, ...] = (
    Configuration("control", None, note="no speculation: the engine's plain sampler"),
    Configuration("draft-prob", "draft_model", {"draft_sample_method": "probabilistic"}, "token",
                  note="draft model sampled from softmax(draft / T); standard rejection sampling"),
    Configuration("draft-greedy", "draft_model", {"draft_sample_method": "greedy"}, "one_hot",
                  cases=("temperature", "warp-1tok", "warp", "position-1tok", "position", "greedy-1tok"), note="draft model argmax, treated as one-hot in rejection sampling"),
    Configuration("block", "draft_model", {"draft_sample_method": "probabilistic", "rejection_sample_method": "block"},
                  "block", cases=("warp-1tok", "warp", "position", "greedy"), note="block verification (Sun et al.) as configured"),
    Configuration("ngram", "ngram", {"prompt_lookup_min": 1, "prompt_lookup_max": 2}, None,
                  cases=("temperature", "warp-1tok", "warp", "penalty", "position"), note="prompt lookup (n-gram) drafts, one-hot"),
    Configuration("suffix", "suffix", {}, None, cases=("warp",), note="suffix decoding (needs Arctic Inference)"),
    Configuration("synthetic", "draft_model", {"rejection_sample_method": "synthetic",
                                               "synthetic_acceptance_rates": [0.8, 0.6, 0.4]}, "synthetic",
                  cases=("temperature", "warp"), lossy=True,
                  note="synthetic acceptance (lossy by design): the harness must reject it"),
)


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
    for c in CASES:
        if c.name == name:
            return c
    raise KeyError(f"unknown case {name!r}; known: {', '.join(c.name for c in CASES)}")


def config(name: str) -> Configuration:
    for c in CONFIGS:
        if c.name == name:
            return c
    raise KeyError(f"unknown configuration {name!r}; known: {', '.join(c.name for c in CONFIGS)}")


def cases_for(cfg: Configuration) -> tuple[Case, ...]:
    return CASES if cfg.cases is None else tuple(case(n) for n in cfg.cases)


def vllm_sampling_kwargs(sampling: SamplingConfig, *, max_new_tokens: int, eos: bool, eos_id: int, seed) -> dict:
    """``SamplingParams`` keyword arguments for one request: every filter set to its explicit off value
    (vLLM: ``top_k=0``, ``top_p=1``, ``min_p=0``), greedy as temperature 0, token ids only."""
    s = sampling
    kw = dict(n=1, max_tokens=max_new_tokens, seed=seed, detokenize=False,
              repetition_penalty=float(s.repetition_penalty), presence_penalty=float(s.presence_penalty),
              frequency_penalty=float(s.frequency_penalty))
    if s.greedy:
        kw.update(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)
    else:
        kw.update(temperature=float(s.temperature), top_k=int(s.top_k or 0), top_p=float(s.top_p or 1.0),
                  min_p=float(s.min_p or 0.0))
    if eos:
        kw.update(ignore_eos=False, stop_token_ids=[eos_id])
    else:
        kw.update(ignore_eos=True)
    if s.logit_bias or s.min_new_tokens or s.constraint is not None:
        raise ValueError("the vLLM matrix has no logit_bias / min_new_tokens / constraint cases")
    return kw


def speculative_config(cfg: Configuration, draft_path: str | None) -> dict | None:
    """The ``speculative_config`` dict passed to ``vllm.LLM`` (None for the control)."""
    if cfg.method is None:
        return None
    spec = {"method": cfg.method, "num_speculative_tokens": K, **cfg.options}
    if cfg.method == "draft_model":
        spec["model"] = draft_path
    return spec
