"""The OpenVINO GenAI adapter (openvino-genai 2026.4.1.0): ``ContinuousBatchingPipeline.generate`` on token ids.

    bash scripts/env.sh openvino                                   # .venv-openvino and the exporter venv
    python -m conformance.engines export openvino               # the IR, once per machine (cached), and its check
    .venv-openvino/bin/python -m conformance.engines openvino --out DIR [--configs a,b] [--check-expected]

Everything but the engine calls is the shared runner's (:mod:`conformance.engines.runner`). Per configuration and
target family the worker builds one ``openvino_genai.ContinuousBatchingPipeline`` on the IR of
:mod:`conformance.engines.openvino.export` (the latency-oriented scheduler config ``LLMPipeline`` uses by default:
prefix caching on, no batched-token limit; ``draft_model(...)`` or ``prompt_lookup`` in its properties) and
generates every case of the family in one ``generate(input_ids, configs)`` call: one ``GenerationConfig`` per
request (:func:`generation_config`, every field set explicitly).

Conventions (declared; ``engine_tests/test_openvino.py`` checks each):

* top-k keeps exactly k tokens through a K-element min-heap over the ids in order (``TopKFilter``); among tokens
  tied with the k-th logit the heap's order decides. At every context the matrix reaches that is the lowest ids
  (``tests/test_openvino_adapter.py`` runs libstdc++'s heap there), so ``top_k_ties="lowest_ids"`` is declared; it
  is not a rule in general (logits [0, 1, 1, 2] at k = 2 keep ids 2 and 3; and the stable sort of top-p then
  keeps tied tokens in the heap's order: row 0 of order1 under the warp settings, which the matrix never reaches);
* the order top-k -> temperature -> min-p -> top-p, top-p over the renormalised top-k (the reference's law);
* seeds: ``GenerationConfig.rng_seed`` seeds a ``std::mt19937`` per request, and defaults to 0, so requests without
  a seed would all be identical: an unseeded request is given a fresh seed of the adapter's own
  (:data:`UNSEEDED_BASE` + i), its record keeps ``seed: null``;
* EOS: a stop token is returned in ``m_generation_ids``; ``ignore_eos`` makes EOS an ordinary token;
* penalties: repetition on the prompt's and the generated ids (the reference's); presence and frequency on the
  generated ids but *sign-dependent* (a negative logit is raised by the penalty): the ``penalty`` case departs by
  definition wherever a penalised token has a negative logit;
* the first token is the target's plain sample at prefill; draft rounds follow.

Speculation with a draft model is the defect this adapter exists to show (:mod:`conformance.engines.openvino.model`
re-implements it; ``docs/openvino-verdict.md``). Counters: the API has no per-request counters; the session sums,
over its ``generate`` calls, the draft pipeline's generated tokens and steps and ``get_num_accepted_tokens()``
from ``extended_perf_metrics`` (``SDPerModelsPerfMetrics``), the engine's own numbers, whatever they mean.
Precision: every pipeline (target, draft, plain) is compiled with :data:`PRECISION` (float32 inference). The CPU
plugin's default is bf16 wherever the CPU has bf16 instructions (AVX512-BF16, AMX): there the engine's logits are not
the tables' (log-probabilities off by up to 0.01 nats) and what is certified would depend on the machine.
Importing this module never imports OpenVINO.
"""
from __future__ import annotations


from ..adapter import Conventions, EngineAdapter, venv_python
from ..matrix import CASES, Configuration
from .export import PRECISION

__all__ = ["ADAPTER", "CONFIGS", "VERSION", "PRECISION", "UNSEEDED_BASE", "MAPPED_KNOBS", "ABSENT_KNOBS",
           "CONDITION_POOL", "GRAMMAR_TOKEN_PREFIX", "generation_fields", "generation_config", "scheduler_options",
           "OpenVINOSession", "OpenVINOAdapter"]

VERSION = "2026.4.1.0"
INSTALL = "bash scripts/env.sh openvino"
UNSEEDED_BASE = 3_000_000_000  # seeds the adapter gives unseeded requests (the engine has no unseeded mode)
#: Requests per ``generate`` call: one call's cost grows faster than linearly with its size here (4 000 requests:
#: 13 s to the first failure, 1 000: 1.3 s), so a batch is sent in chunks (each still mixes the cases' settings).
CHUNK = 500
#: The provoking call of ``draft-after-error``: larger than a chunk, so every request id of the later calls
#: (0 .. CHUNK - 1) is one the failed call left behind.
PROVOKE_N = 1_000
K = 3

#: Every matrix case (the penalty case departs by the engine's penalty definition: recorded, explained).
ALL = tuple(c.name for c in CASES)
SPEC = ("warp", "eos", "position")
#: The request-feature cases (:data:`conformance.engines.matrix.FEATURE_CASES`): min_new_tokens is a GenerationConfig
#: field; logit_bias is not (refused, with that reason).
FEATURES = ("min-tokens", "logit-bias")
#: Stop strings (``GenerationConfig.stop_strings``, the stop tokens kept in the ids): token ids and finish reason only;
#: on the plain pipeline alone (with prompt lookup the engine raises in a mixed batch and a retry once hung: defect F).
TEXT_CASES = ("stop-strings",)
#: Structured output (``GenerationConfig.structured_output_config``, xgrammar's EBNF) and log-probabilities
#: (``GenerationConfig.logprobs`` 1: the returned token's value, read through a generation handle): on the plain
#: pipeline, prompt lookup and the draft model without prefix caching (with it every draft-model case raises: defect
#: B), the last in a configuration of its own (``draft-k3-nopc-features``).
GRAMMAR_CASES = ("grammar",)
LOGPROB_CASES = ("logprobs",)
#: Several completions per request (``num_return_sequences``, multinomial): the plain pipeline runs it; with prompt
#: lookup or a draft model the engine refuses it ("parallel sampling is not compatible with assistant generation").
N_CASES = ("n-samples",)
#: How xgrammar sees the vocabulary of the tokenizer IR (``Tokenizer.get_vocab``: ``b' t0'`` ... ``b' t6'``): each
#: token's name after a space, so the grammar's literals carry it (without it only EOS matches).
GRAMMAR_TOKEN_PREFIX = " "


def _draft(k: int, *, caching: bool = True, **extra) -> dict:
    return {"draft": True, "num_assistant_tokens": k, "prefix_caching": caching, **extra}


CONFIGS: tuple[Configuration, ...] = (
    Configuration("control-cold", None, {"prefix_caching": False}, cases=(), condition_settings={"prefix_caching": False},
                  note="no speculation, prefix caching off: under a prefix-caching condition, the cold run the cached "
                       "control is compared with per seed"),
    Configuration("control", None, {"prefix_caching": True},
                  cases=ALL + FEATURES + TEXT_CASES + GRAMMAR_CASES + LOGPROB_CASES + N_CASES,
                  condition_identical_to="control-cold",
                  note="no speculation (the latency-oriented scheduler config: prefix caching on)"),
    Configuration("draft-k3", "draft_model", _draft(3), None, cases=("warp", "position"), k=3,
                  note="draft model, num_assistant_tokens 3, prefix caching on (LLMPipeline's default)"),
    Configuration("draft-k3-nopc", "draft_model", _draft(3, caching=False), None, cases=SPEC, k=3,
                  note="draft model, num_assistant_tokens 3, prefix caching off"),
    Configuration("draft-k3-nopc-features", "draft_model", _draft(3, caching=False), None,
                  cases=GRAMMAR_CASES + LOGPROB_CASES + N_CASES, k=3, efficiency=False,
                  note="draft-k3-nopc for the grammar, logprobs and n-samples cases, in batches of their own: this "
                       "engine's speculative outputs per seed depend on the other requests of the batch (longer "
                       "requests change draft-k3-nopc's warp completions, which the stage checks against the "
                       "mechanism's model)"),
    Configuration("draft-k1-nopc", "draft_model", _draft(1, caching=False), None, cases=("eos",), k=1,
                  note="draft model, num_assistant_tokens 1, prefix caching off"),
    Configuration("draft-k5-nopc", "draft_model", _draft(5, caching=False), None, cases=("eos",), k=5,
                  note="draft model, num_assistant_tokens 5, prefix caching off"),
    Configuration("draft-same-nopc", "draft_model", _draft(3, caching=False, pair="order1-same"), None,
                  cases=("warp",), k=3, note="the draft identical to the target (order1-same), k 3, prefix caching off"),
    Configuration("draft-greedy", "draft_model", _draft(3), None, cases=("greedy-1tok", "greedy"), k=3,
                  identical_to="control", note="greedy with the draft model (k 3): token for token the plain greedy"),
    Configuration("prompt-lookup", "prompt_lookup", {"prompt_lookup": True, "num_assistant_tokens": 3,
                                                     "max_ngram_size": 2, "prefix_caching": True}, None,
                  cases=("warp-1tok", "eos", "position", "greedy") + FEATURES + GRAMMAR_CASES + LOGPROB_CASES
                  + N_CASES, k=3,
                  identical_to="control",
                  note="prompt lookup (num_assistant_tokens 3, max_ngram_size 2): sample-and-match"),
    Configuration("draft-after-error", "draft_model", _draft(3, provoke=True), None, cases=("warp",), k=3,
                  identical_to="control",
                  note="draft model k 3 after one generate call that raised the Check error (caught)"),
)


def generation_fields(request, cfg: Configuration, *, seed: int) -> dict:
    """One request's ``GenerationConfig`` fields: every field the law depends on set explicitly (filters at their
    off values: ``top_k`` 0, ``top_p`` 1, ``min_p`` 0), EOS as the one stop token (``ignore_eos`` when EOS is an
    ordinary token), the request's seed, the speculative options of the configuration. Pure: no OpenVINO."""
    s = request.sampling
    if s.logit_bias:
        raise ValueError("OpenVINO GenAI's GenerationConfig has no logit_bias")
    if s.bad_words:
        raise ValueError("OpenVINO GenAI's GenerationConfig has no bad words")
    if request.stream:
        raise ValueError("streaming: this adapter calls ContinuousBatchingPipeline.generate on token ids (no stream)")
    f = {"max_new_tokens": int(request.max_new_tokens), "min_new_tokens": int(s.min_new_tokens),
         "apply_chat_template": False,
         "echo": False, "num_return_sequences": int(request.n), "num_beams": 1, "logprobs": 1 if request.logprobs else 0,
         "repetition_penalty": float(s.repetition_penalty), "presence_penalty": float(s.presence_penalty),
         "frequency_penalty": float(s.frequency_penalty)}
    if s.greedy:
        f["do_sample"] = False
    else:
        f.update(do_sample=True, temperature=float(s.temperature), top_k=int(s.top_k or 0),
                 top_p=float(s.top_p or 1.0), min_p=float(s.min_p or 0.0))
    f.update(eos_token_id=int(request.eos_id), stop_token_ids={int(request.eos_id)}, ignore_eos=not request.eos,
             rng_seed=int(seed))
    if s.constraint is not None:  # xgrammar's EBNF (a StructuredOutputConfig in generation_config)
        from ..features import grammar_text

        f["grammar"] = grammar_text(s.constraint, int(request.eos_id), GRAMMAR_TOKEN_PREFIX)
    if request.stop:  # the stop string's tokens stay in the ids (as vLLM and llama-server return them)
        f.update(stop_strings=set(request.stop), include_stop_str_in_output=True)
    o = cfg.options
    if o.get("draft") or o.get("prompt_lookup"):
        f["num_assistant_tokens"] = int(o["num_assistant_tokens"])
    if o.get("prompt_lookup"):
        f["max_ngram_size"] = int(o["max_ngram_size"])
    return f


def generation_config(request, cfg: Configuration, *, seed: int):
    """:func:`generation_fields` as an ``openvino_genai.GenerationConfig``."""
    import openvino_genai as ov_genai

    c = ov_genai.GenerationConfig()
    for key, value in generation_fields(request, cfg, seed=seed).items():
        if key == "eos_token_id":
            c.set_eos_token_id(value)
        elif key == "grammar":
            c.structured_output_config = ov_genai.StructuredOutputConfig(grammar=value)
        else:
            setattr(c, key, value)
    return c


#: The serving-condition knobs mapped to ``SchedulerConfig``: ``prefix_caching`` -> ``enable_prefix_caching``,
#: ``token_budget`` -> ``max_num_batched_tokens`` (dynamic split-fuse on: a longer prefill is chunked), ``kv_blocks`` ->
#: ``num_kv_blocks``. ``block_size`` is the CPU plugin's own (not a setting): accepted, and read back by a probe.
MAPPED_KNOBS = ("prefix_caching", "token_budget", "kv_blocks", "block_size")
ABSENT_KNOBS = {"max_model_len": "OpenVINO GenAI has no context-limit setting: a request may use the IR's positions "
                                 "(128 for the order-2 target)"}
#: The KV pool of a condition's pipeline when the condition sets none: counted in blocks (not ``cache_size`` in GB), so
#: that the pool's usage reads as blocks (:mod:`conformance.engines.openvino.probes`).
CONDITION_POOL = 2048


def scheduler_options(cfg: Configuration, condition=None) -> dict:
    """The scheduler's settings: ``get_latency_oriented_scheduler_config`` (what ``LLMPipeline`` uses), prefix
    caching as the configuration says; under a serving condition, its knobs (:data:`MAPPED_KNOBS`; a knob this
    engine has no setting for raises, naming it) and a pool of :data:`CONDITION_POOL` blocks unless it sets one."""
    out = {"enable_prefix_caching": bool(cfg.options.get("prefix_caching", True)), "max_num_batched_tokens": 1 << 31,
           "max_num_seqs": 256, "cache_size": 1, "dynamic_split_fuse": True}
    if condition is None:
        return out
    knobs = condition.settings
    missing = sorted(set(knobs) - set(MAPPED_KNOBS) - set(ABSENT_KNOBS))
    if missing:
        raise NotImplementedError(f"OpenVINO GenAI has no setting for {', '.join(missing)} ({condition.name})")
    if "max_model_len" in knobs and int(knobs["max_model_len"]) > 128:
        raise NotImplementedError(f"max_model_len {knobs['max_model_len']}: the IR has 128 positions ({condition.name})")
    out.update(cache_size=0, num_kv_blocks=int(knobs.get("kv_blocks", CONDITION_POOL)))
    if "prefix_caching" in knobs:
        out["enable_prefix_caching"] = bool(knobs["prefix_caching"])
    if "token_budget" in knobs:
        out["max_num_batched_tokens"] = int(knobs["token_budget"])
    return out


def _record(request, sequences) -> dict:
    """One request's record from its sequences ``(token ids, finish reason, log-probabilities or None)``: the
    completion itself, or for ``n > 1`` one record per completion with its index (the black-box format)."""
    recs = []
    for toks, reason, lps in sequences:
        rec = {"completion_ids": toks, "finish_reason": getattr(reason, "name", str(reason)).lower()}
        if request.logprobs:
            rec["logprobs"] = lps
        recs.append(rec)
    if request.n > 1:
        return {"samples": [{**rec, "index": j} for j, rec in enumerate(recs)]}
    return recs[0]


class OpenVINOSession:
    """One ``ContinuousBatchingPipeline`` for one configuration and target family."""

    def __init__(self, cfg: Configuration, pair, condition=None):
        import openvino_genai as ov_genai

        from .export import ir_dir

        self.cfg, self.condition = cfg, condition
        sched = ov_genai.SchedulerConfig()
        options = scheduler_options(cfg, condition)
        for key, value in options.items():
            setattr(sched, key, value)
        props = dict(PRECISION)
        if cfg.options.get("draft"):
            props["draft_model"] = ov_genai.draft_model(str(ir_dir(pair.draft.name)), "CPU", **PRECISION)
        if cfg.options.get("prompt_lookup"):
            props["prompt_lookup"] = True
        target = ir_dir(pair.target.name)
        if not (target / "openvino_model.xml").exists():
            raise FileNotFoundError(f"{target}: no IR; export it with `python -m conformance.engines export openvino "
                                    "--export`")
        self.pipe = ov_genai.ContinuousBatchingPipeline(str(target), sched, "CPU", props)
        self.target, self.sched, self.plain_pipe = target, sched, None
        self.unseeded = 0
        self.totals = {"calls": 0, "drafts": 0, "draft_tokens": 0, "accepted": 0, "uncounted": 0}
        self.provoked = None
        if cfg.options.get("provoke"):
            self.provoked = self._provoke(pair)
        self.served = 0  # tokens the prefix cache served the probe (:meth:`_probe`)
        self.evidence = None if condition is None else self._probe(pair, options)

    def _probe(self, pair, options: dict) -> dict:
        """The condition's evidence from probe requests in this pipeline (:mod:`conformance.engines.openvino.
        probes`): its block size, the token budget its prefill follows, the tokens its prefix cache served."""
        import numpy as np
        import openvino as ov

        from ..adapter import Request
        from .probes import BlockProbe, stated_budget
        from specdec_ref.warp import GREEDY

        def request(prompt, max_new_tokens):
            r = Request("probe", tuple(prompt), GREEDY, max_new_tokens, False, int(pair.target.eos_id), 0)
            return ov.Tensor(np.array([list(prompt)], dtype=np.int64)), generation_config(r, self.cfg, seed=0)

        probe = BlockProbe(self.pipe, options["num_kv_blocks"], request, int(pair.target.bos_id))
        out = {"block_size": probe.block_size(), "prefix_cache_hits": 0}
        if "token_budget" in self.condition.settings:
            longest = max(len(p) for case in self.condition.cases for p in case.prompts)
            out["token_budget"] = stated_budget(options["max_num_batched_tokens"], longest, probe.prefill_steps(longest))
        if options["enable_prefix_caching"] and out["block_size"]:
            self.served = probe.prefix_served(out["block_size"])
        return out

    def condition_counters(self) -> dict | None:
        """The probes' readings (:meth:`_probe`); ``prefix_cache_hits`` counts the tokens the cache served the probe,
        taken as served during the session's first batch (a counter: the worker reads it before and after each
        batch), so a condition of several cases would show it on its first case only: each OpenVINO condition has
        one."""
        if self.evidence is None:
            return None
        return {**self.evidence, "prefix_cache_hits": self.served if self.totals["calls"] else 0}

    def _provoke(self, pair) -> str:
        """One call that fails (the Check error of a rejected last draft under prefix caching), caught. Its
        requests run 30 tokens, so none has finished when it fails: every one of its request ids is left behind."""
        from ..adapter import Request
        from specdec_ref.warp import SamplingConfig

        reqs = [Request("provoke", (2, 6), SamplingConfig(temperature=1.0), 30, False, int(pair.target.eos_id),
                        9_000_000 + i) for i in range(PROVOKE_N)]
        try:
            self.generate(reqs, chunk=PROVOKE_N)
        except Exception as exc:  # noqa: BLE001 - the point: the engine raises, the caller goes on
            return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else repr(exc)
        raise RuntimeError("the provoking call did not raise: the fall-back cannot be shown this way")

    def _seed(self, r) -> int:
        if r.seed is not None:
            return int(r.seed)
        self.unseeded += 1
        return UNSEEDED_BASE + self.unseeded

    def generate(self, requests, chunk: int = CHUNK) -> list[dict]:
        out = []
        for i in range(0, len(requests), chunk):
            out += self._generate(requests[i:i + chunk])
        return out

    def _generate(self, requests) -> list[dict]:
        import numpy as np
        import openvino as ov

        ids = [ov.Tensor(np.array([list(r.prompt)], dtype=np.int64)) for r in requests]
        configs = [generation_config(r, self.cfg, seed=self._seed(r)) for r in requests]
        if any(r.logprobs for r in requests):
            return self._generate_handles(requests, ids, configs)
        results = self.pipe.generate(ids, configs)
        if results:
            self._count(results[0].extended_perf_metrics)
        out = []
        for req, r in zip(requests, results):
            reasons = list(r.finish_reasons)
            out.append(_record(req, [([int(t) for t in ids_j], reasons[j] if j < len(reasons) else None, None)
                                     for j, ids_j in enumerate(r.m_generation_ids)]))
        if self.provoked is not None:
            self._against_plain(ids, configs, out)
        return out

    def _generate_handles(self, requests, ids, configs) -> list[dict]:
        """The chunk through generation handles (``add_request``, ``step`` until done, ``read_all``: one output per
        sequence): what ``generate`` does inside, and the only way to the per-token log-probabilities
        (``generated_log_probs``). No speculative counters come this way: the session then reports none
        (:meth:`counters`)."""
        handles = [self.pipe.add_request(i, x, c) for i, (x, c) in enumerate(zip(ids, configs))]
        while self.pipe.has_non_finished_requests():
            self.pipe.step()
        self.totals["uncounted"] += 1
        out = []
        for req, h in zip(requests, handles):
            seqs = []
            for o in h.read_all():
                toks = [int(t) for t in o.generated_ids]
                lps = [{str(t): float(v)} for t, v in zip(toks, o.generated_log_probs)]
                seqs.append((toks, o.finish_reason, lps if req.logprobs and len(lps) == len(toks) else None))
            out.append(_record(req, seqs))
        return out

    def _against_plain(self, ids, configs, out) -> None:
        """After a caught engine error the engine's counters cannot be believed (they report drafts and accepted
        tokens for requests that ran as plain sampling), and the API has no per-request counters: each request is
        rerun WITHOUT speculation under its seed, and a completion identical to it is recorded as having drafted
        nothing (``draft_tokens`` 0; 1 where it departs: this engine's speculation always changes the target's
        random stream, so a speculating request is per seed identical to plain sampling only by chance)."""
        import openvino_genai as ov_genai

        if self.plain_pipe is None:
            self.plain_pipe = ov_genai.ContinuousBatchingPipeline(str(self.target), self.sched, "CPU", PRECISION)
        for c in configs:
            c.num_assistant_tokens = 0
        plain = self.plain_pipe.generate(ids, configs)
        for rec, p in zip(out, plain):
            same = rec["completion_ids"] == [int(t) for t in p.m_generation_ids[0]]
            rec.update(draft_tokens=0 if same else 1, accepted=0, identical_to_plain=same)

    def _count(self, m) -> None:
        self.totals["calls"] += 1
        if m is None:
            return
        draft = m.draft_model_metrics
        self.totals["drafts"] += len(draft.raw_metrics.m_durations)
        self.totals["draft_tokens"] += int(draft.get_num_generated_tokens())
        self.totals["accepted"] += int(m.get_num_accepted_tokens())

    def counters(self) -> dict | None:
        if not self.cfg.options.get("draft") or self.totals["uncounted"]:
            return None  # prompt lookup reports no speculative metrics, nor does a call through handles
        return {k: self.totals[k] for k in ("drafts", "draft_tokens", "accepted")} | {"accepted_per_pos": None}

    def refuses(self, r) -> str | None:
        """``GenerationConfig.validate()``: the engine's own check of the settings."""
        try:
            generation_config(r, self.cfg, seed=0).validate()
        except Exception as exc:  # noqa: BLE001 - its message names the refused setting
            return str(exc).strip().splitlines()[0][:300]
        return None

    def close(self) -> None:
        del self.pipe


class OpenVINOAdapter(EngineAdapter):
    def python(self) -> str:
        return venv_python("openvino_genai", ".venv-openvino", INSTALL)

    def installed_version(self) -> str:
        import openvino_genai

        return openvino_genai.__version__.split("-")[0]

    def open(self, cfg, family):
        from specdec_ref.exact import exact_pair

        name = cfg.options.get("pair") if family == "order1" and cfg.options.get("pair") else self.families[family]
        return OpenVINOSession(cfg, exact_pair(name))

    def open_condition(self, cfg, family, condition):
        from specdec_ref.exact import exact_pair

        scheduler_options(cfg, condition)  # a knob without a setting raises here, before any load
        return OpenVINOSession(cfg, exact_pair(self.families[family]), condition=condition)

    def export(self, check: bool = True) -> list[dict]:
        """The IR of every exactly-known model (optimum-cli in the exporter's venv, cached by version and source) and,
        with ``check``, its logits against the tables, as prompts and through the KV cache."""
        from .export import MODELS, check_logits, export, ir_dir

        rows = [{"model": n, "passed": True, "text": f"IR {n}: {'current' if s == 0.0 else f'exported in {s:.1f} s'} "
                 f"-> {ir_dir(n)}"} for n, s in export(MODELS).items()]
        if not check:
            return rows
        try:
            checked = check_logits(MODELS)
        except AssertionError as exc:  # a model past the tolerance: that row fails, named
            return rows + [{"model": "?", "passed": False, "text": str(exc)}]
        return rows + [{"model": n, "passed": True, "text": f"logits {n}: {r['contexts']} contexts, max |IR - table| "
                        f"{r['prompt']:.2e} as prompts, {r['kv_cache']:.2e} through the KV cache"}
                       for n, r in checked.items()]


ADAPTER = OpenVINOAdapter(
    name="openvino", title="OpenVINO GenAI", version=VERSION, install=INSTALL, configurations=CONFIGS, k=K,
    cases=ALL + FEATURES + TEXT_CASES + GRAMMAR_CASES + LOGPROB_CASES + N_CASES, timeout_s=900.0,
    conditions={"block-boundary": ("control", "prompt-lookup", "draft-k3"),
                "chunked-prefill": ("control", "prompt-lookup", "draft-k3"),
                "prefix-cache": ("control-cold", "control", "prompt-lookup", "draft-k3"),
                "distinct-prompts": ("control-cold", "control", "prompt-lookup")},
    absent_knobs=ABSENT_KNOBS,
    seed_probe=True, preload_modules=("openvino_genai", __name__),
    conventions=Conventions(
        top_k_ties="lowest_ids", first_token_at_prefill=True, seeds="per_request", logprobs="raw", logprobs_top=False,
        notes=("top-k keeps exactly k by a min-heap over the ids in order: the lowest-ids law on every row of this "
               "matrix, not a rule in general (logits [0, 1, 1, 2], k 2 keep ids 2 and 3)",
               "rng_seed defaults to 0 for every request: unseeded requests get distinct seeds from the adapter",
               "presence / frequency penalties are sign-dependent (a negative logit is raised)",
               "the draft and the target each seed a std::mt19937 with the request's rng_seed: one stream twice",
               "a stop token is returned; the draft stops drafting after EOS even with ignore_eos",
               "stop strings match the detokenizer's text, tokens joined by a space (t0 t6 t4): the cases' stop "
               "strings never begin with a space, so the stop rule is the one of token_prefix ' '; token ids and "
               "finish reason only (the adapter asks for no text)",
               "log-probabilities: the returned token's, raw (before temperature), no top list and none for the "
               "prompt (GenerationConfig.logprobs above 1 is treated as 1); read through a generation handle "
               "(add_request / step), which reports no speculative counters"),
        token_prefix=" "),
)
