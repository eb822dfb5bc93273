"""The llama.cpp adapter: ``llama-server`` built from the source vendored in ``llama-cpp-python==0.3.36``.

    bash scripts/env.sh llamacpp                       # build once per machine (cached outside the clone)
    python -m conformance.engines export llamacpp      # the GGUF files, their probabilities against the tables
    python -m conformance.engines llamacpp --out DIR [--configs a,b] [--check-expected]

Everything but the engine calls is the shared runner's (:mod:`conformance.engines.runner`). Per configuration and
target family the worker's session starts ``llama-server`` on 127.0.0.1 (a free port, in the worker's own process
group, so the runner's group kill stops it too) on the GGUF files of :mod:`conformance.engines.llamacpp.gguf_export`, waits
for ``/health``, sends ``/completion`` requests with token-id prompts from a bounded thread pool (several in flight
for ``-np`` > 1; every request with a timeout), reads the speculative counters from ``/metrics`` and per request
from ``timings`` (``draft_n``, ``draft_n_accepted``), and stops the server in ``close()``.

Conventions (declared, and each checked by ``engine_tests/test_llamacpp.py``):

* every request sets its sampler chain explicitly, ``penalties, temperature, top_k, top_p, min_p`` (llama.cpp's
  default chain applies the temperature *last*, after top-p / min-p: a different law from the reference warper's),
  and every other filter off (typical, top-n-sigma, XTC, DRY, mirostat, dynamic temperature); greedy is
  temperature 0 (llama.cpp keeps the first maximal logit, the reference's first-index argmax);
* top-k keeps exactly k tokens; among tokens tied at the k-th logit, libstdc++'s ``std::partial_sort`` heap over
  the candidates in id order decides: deterministic, but no stated rule and *not* the lowest ids in general (logits
  ``[5, 1, 5, 5, 9]`` at k 2 keep ids 2 and 4). On every row the matrix's cases reach, llama.cpp's post-sampling
  distribution equals the reference warper's under the lowest-ids rule (where the kept set differs, the tied tokens
  it differs by are cut by the top-p that follows): ``engine_tests/test_llamacpp.py`` checks it row by row against
  the server, so ``top_k_ties="lowest_ids"`` states llama.cpp's law for these cases (not its rule);
* penalties: llama.cpp's penalty window (``repeat_last_n``) holds the prompt and the output, and its presence and
  frequency penalties count the prompt's tokens too, where the reference counts generated tokens only: the
  ``penalty`` case is left out of the matrix (it is run alone in ``penalty-window``, recorded NOT CERTIFIED by
  definition, so the departure stays measured);
* EOS: ``ignore_eos`` adds a logit bias of -inf to every end-of-generation token, so EOS can never be an
  ordinary token; cases where it is (and the efficiency set) run on the ``plain`` GGUF variant, whose token 7 is
  an ordinary token. When EOS stops, ``tokens`` holds it (the black-box files keep it);
* the first token is a plain target sample at prefill; speculative rounds follow (``first_token_at_prefill``);
* a request's ``seed`` seeds its sampler (unseeded requests send none: llama.cpp seeds from the clock);
* prompt caching is on (the server's default): a slot reuses the KV cache of the previous request's prefix.

Speculation: every ``--spec-type`` verifies by *sample-and-match*: the target samples each position with the
request's own sampler and keeps drafts while they equal its samples, so a seed's output is the same with and
without speculation (``identical_to="control"``, checked request by request). A round drafts ``min(k, r - 1)``
tokens with ``r`` still to emit (``drafts_to_end``). ``draft-simple`` drafts the draft model's argmax (scheme
``sample_match``: its exact acceptance is :func:`efficiency.sample_match_expected`); the n-gram types draft from the
context (lossless by the same argument; no exact acceptance law stated). ``draft-eagle3`` and ``draft-mtp`` run the
exactly-known heads of :mod:`conformance.engines.llamacpp.gguf_heads` (``proposer="exact-eagle3"``); for every
configuration with a ``proposer`` the rounds are rebuilt from the efficiency set's completions and must equal each
request's ``draft_n`` / ``draft_n_accepted`` (:mod:`conformance.engines.rounds`). A set-up with ``start_at_open``
starts its server when the session opens, so a set-up llama.cpp refuses is the configuration's load error, with the
server log's error lines (what each refused set-up printed: docs/llamacpp-verdict.md).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

from ..adapter import Conventions, EngineAdapter, EngineMissingError
from ..session import VariantSession
from ..matrix import CASES, Configuration
from ..features import grammar_text
from ..serving import HttpServer, sse_events

__all__ = ["ADAPTER", "CONFIGS", "VERSION", "SAMPLERS", "engine_home", "server_binary", "completion_payload",
           "server_args", "parse_metrics", "Server", "LlamaCppSession", "check_gguf"]

VERSION = "0.3.36"  # llama-cpp-python's sdist; its vendor/llama.cpp is what scripts/env.sh llamacpp builds
INSTALL = "bash scripts/env.sh llamacpp"
SAMPLERS = ("penalties", "temperature", "top_k", "top_p", "min_p")
REQUEST_TIMEOUT_S = 60.0
FINISH = {"eos": "eos", "limit": "length", "word": "stop"}  # the server's stop_type -> the black-box format
START_TIMEOUT_S = 90.0

#: Every matrix case but ``penalty``, which llama.cpp cannot express under the reference's definition (its window
#: counts the prompt, see the module docstring).
MAIN = tuple(c.name for c in CASES if c.name != "penalty")
#: A configuration that claims per-seed identity with ``control`` is checked request by request: its law verdicts
#: are then control's by construction, so the variants run the few cases that exercise what they change (both
#: families, one- and two-token prompts, EOS inside a draft, greedy), not the whole matrix (stage time).
SHORT = ("warp-1tok", "eos", "position", "greedy")
#: Stop strings and streaming (``/completion``'s ``stop`` and ``stream``; its ``content`` is the text checked).
TEXT_CASES = ("stop-strings", "stop-stream")
#: Structured output: ``/completion``'s ``grammar`` (GBNF, :func:`conformance.engines.features.grammar_text`).
GRAMMAR_CASES = ("grammar",)


def _draft(k: int, **extra) -> dict:
    return {"spec_type": "draft-simple", "draft_model": True, "draft_max": k, "draft_min": 0, "p_min": 0.0, **extra}


#: ``draft-eagle3`` on the exactly-known EAGLE-3 head (:mod:`conformance.engines.llamacpp.gguf_heads`) over the deep target
#: of the order-1 table: order-1 cases only (one- and two-token prompts, EOS inside a draft, EOS ordinary, greedy).
#: ``--no-spec-draft-backend-sampling``: with the default (on), the drafter's backend top-k 10 aborts on a vocabulary
#: of 8 (``draft-eagle3-backend`` records it). Its rounds and acceptance follow the head's one-hot proposals
#: (``proposer="exact-eagle3"``, :mod:`conformance.engines.rounds`).
EAGLE3_CASES = ("warp-1tok", "eos", "temperature", "greedy-1tok")


def _eagle3(k: int, **extra) -> dict:
    return {"spec_type": "draft-eagle3", "draft_model": True, "head": "eagle3", "draft_max": k, "draft_min": 0,
            "p_min": 0.0, "backend_sampling": False, **extra}


def _mtp(k: int, **extra) -> dict:
    """``draft-mtp`` on the qwen35 target whose MTP block proposes exactly what the EAGLE-3 head proposes
    (:func:`conformance.engines.llamacpp.gguf_heads.write_mtp_gguf`): the same expectation."""
    return {"spec_type": "draft-mtp", "head": "mtp", "draft_max": k, "draft_min": 0, "p_min": 0.0,
            "backend_sampling": False, **extra}


#: The n-gram types draft from the request's own context (ngram-mod: from a hash shared across requests), and
#: the matrix's requests are too short for any of them (ngram-simple needs more than n + m + 1 context tokens,
#: ngram-mod learns in chunks of 32 tokens; ngram-cache drafted nothing in any setting tried, up to 100-token
#: requests, greedy or sampled): on the matrix they are ``not_speculating`` (recorded), so they run the cheapest
#: case, greedy-1tok, besides the efficiency set (10 tokens: the first three do draft there, observed only), and
#: their per-seed identity with ``control`` on 16-token requests, where they draft, is checked by
#: ``engine_tests/test_llamacpp.py::test_every_spec_type_is_identical_per_seed_on_long_requests``.
NGRAM_CASES = ("greedy-1tok",)


def _ngram(name: str, note: str, **flags) -> Configuration:
    return Configuration(name, name, {"spec_type": name, "flags": {f"--spec-{name}-{k.replace('_', '-')}": v
                                                                   for k, v in flags.items()}},
                         None, cases=NGRAM_CASES, identical_to="control",
                         k=int(flags.get("size_m", flags.get("n_max", 3))), note=note)


CONFIGS: tuple[Configuration, ...] = (
    Configuration("control-cold", None, {}, cases=(), condition_settings={"prefix_caching": False},
                  note="no speculation, one slot, cache_prompt off: under a prefix-caching condition, the cold run the "
                       "cached control is compared with per seed"),
    Configuration("control", None, {}, cases=MAIN + ("logit-bias", "logprobs") + TEXT_CASES + GRAMMAR_CASES,
                  condition_identical_to="control-cold", note="no speculation, one slot (-np 1)"),
    Configuration("control-np4", None, {"parallel": 4}, cases=("position", "n-samples"), identical_to="control",
                  note="no speculation, four parallel slots (-np 4): per seed identical to one slot"),
    Configuration("draft-k3", "draft-simple", _draft(3), "sample_match",
                  cases=SHORT + ("logit-bias", "logprobs") + TEXT_CASES + GRAMMAR_CASES,
                  identical_to="control", k=3,
                  proposer="draft",
                  note="draft model, --spec-type draft-simple --spec-draft-n-max 3 --spec-draft-n-min 0 "
                       "--spec-draft-p-min 0 (llama.cpp's defaults)"),
    Configuration("draft-k1", "draft-simple", _draft(1), "sample_match", cases=("warp",), identical_to="control", k=1,
                  proposer="draft",
                  note="draft-simple, --spec-draft-n-max 1"),
    Configuration("draft-k5", "draft-simple", _draft(5), "sample_match", cases=("eos", "position"),
                  identical_to="control", k=5, proposer="draft", note="draft-simple, --spec-draft-n-max 5"),
    Configuration("draft-k3-np4", "draft-simple", _draft(3, parallel=4), "sample_match", cases=("position", "n-samples"),
                  identical_to="control-np4", k=3, proposer="draft",
                  note="draft-simple --spec-draft-n-max 3 with four parallel slots (-np 4): per seed identical to "
                       "them without speculation, each of a request's n completions included"),
    Configuration("draft-ignored", "draft-model (no --spec-type)", {"draft_model": True, "draft_max": 3},
                  "sample_match", cases=("warp",), k=3,
                  note="-md DRAFT without --spec-type: llama.cpp loads the draft and silently does not speculate"),
    _ngram("ngram-simple", "n-gram lookup in the context (n 1, m 3; needs more than 5 context tokens)", size_n=1,
           size_m=3),
    _ngram("ngram-map-k", "n-gram map, key only (n 1, m 3)", size_n=1, size_m=3),
    _ngram("ngram-map-k4v", "n-gram map, key and four values (n 1, m 3)", size_n=1, size_m=3),
    _ngram("ngram-mod", "n-gram hash shared across requests (match 2, 1-3 drafts; learns in chunks of 32 tokens)",
           n_match=2, n_min=1, n_max=3),
    Configuration("ngram-cache", "ngram-cache", {"spec_type": "ngram-cache"}, None, cases=NGRAM_CASES,
                  identical_to="control", k=8,
                  note="n-gram cache of the context (up to 8 drafts; drafted nothing in any setting tried)"),
    Configuration("draft-eagle3", "draft-eagle3", _eagle3(3), "sample_match", cases=EAGLE3_CASES,
                  identical_to="control", k=3, proposer="exact-eagle3",
                  note="the exactly-known EAGLE-3 head (GGUF arch eagle3, target layers 0, 1, 2, d2t) on the 3-layer "
                       "deep target: --spec-type draft-eagle3 --spec-draft-n-max 3 --no-spec-draft-backend-sampling"),
    Configuration("draft-eagle3-backend", "draft-eagle3", _eagle3(3, backend_sampling=True, start_at_open=True),
                  "sample_match", cases=("greedy-1tok",), k=3,
                  note="draft-eagle3 with llama.cpp's default backend draft sampling: its top-k 10 in the sampling "
                       "graph aborts at load on a vocabulary of 8 (recorded error)"),
    Configuration("draft-mtp", "draft-mtp", _mtp(3), "sample_match", cases=EAGLE3_CASES, identical_to="control", k=3,
                  proposer="exact-eagle3",
                  note="the order-1 table in a qwen35 target with an exactly-known MTP block (nextn_predict_layers 1): "
                       "--spec-type draft-mtp --spec-draft-n-max 3 --no-spec-draft-backend-sampling"),
    Configuration("draft-mtp-llama", "draft-mtp", {"spec_type": "draft-mtp", "draft_max": 3, "start_at_open": True},
                  "sample_match", cases=("greedy-1tok",), k=3,
                  note="--spec-type draft-mtp on the order-1 Llama target: refused, no NextN (MTP) layers (recorded "
                       "error)"),
    Configuration("penalty-window", None, {}, cases=("penalty",),
                  note="the penalty case alone: llama.cpp's presence penalty counts the prompt (NOT CERTIFIED by "
                       "definition, recorded)"),
)


# ----------------------------------------------------------------------------- the build, the request mapping


def engine_home() -> Path:
    """``$SPECDEC_CACHE/llama.cpp-<version>`` (default ``~/.cache/specdec-ref``): what scripts/env.sh llamacpp builds."""
    from .gguf_export import cache_root

    return cache_root() / f"llama.cpp-{VERSION}"


def server_binary() -> Path:
    b = engine_home() / "bin" / "llama-server"
    if not b.exists():
        raise EngineMissingError(f"{b} is not built: build it with `{INSTALL}`")
    return b


def completion_payload(request) -> dict:
    """``/completion``'s body for one :class:`Request`: token ids in and out, the reference warper's order, every
    other filter off, EOS never banned (see the module docstring), the seed when the request has one."""
    s = request.sampling
    if s.min_new_tokens:
        raise ValueError("the llama.cpp matrix has no min_new_tokens case")
    if s.bad_words:
        raise ValueError("llama-server takes no multi-token bad words (a logit_bias of false bans a token everywhere)")
    body = {
        "prompt": [int(t) for t in request.prompt], "n_predict": int(request.max_new_tokens), "stream": False,
        "return_tokens": True, "cache_prompt": True, "samplers": list(SAMPLERS), "ignore_eos": False,
        "temperature": 0.0 if s.greedy else float(s.temperature),
        "top_k": 0 if s.greedy or not s.top_k else int(s.top_k),
        "top_p": 1.0 if s.greedy or not s.top_p else float(s.top_p),
        "min_p": 0.0 if s.greedy or not s.min_p else float(s.min_p),
        "typical_p": 1.0, "top_n_sigma": -1.0, "xtc_probability": 0.0, "dry_multiplier": 0.0, "mirostat": 0,
        "dynatemp_range": 0.0, "min_keep": 0, "n_probs": 0,
        "repeat_penalty": float(s.repetition_penalty), "presence_penalty": float(s.presence_penalty),
        "frequency_penalty": float(s.frequency_penalty), "repeat_last_n": 128,  # >= the whole context
        "response_fields": ["tokens", "stop_type", "timings/draft_n", "timings/draft_n_accepted"],
    }
    if s.constraint is not None:  # a grammar on the tokens' text; llama.cpp resamples under it: the masked law
        body["grammar"] = grammar_text(s.constraint, request.eos_id)
    if s.logit_bias:  # llama.cpp puts its logit-bias sampler first in the chain, as the reference applies it first
        body["logit_bias"] = [[int(t), float(b)] for t, b in s.logit_bias]
    if request.seed is not None:
        body["seed"] = int(request.seed)
    if getattr(request, "logprobs", None):  # the raw distribution's top n (post_sampling_probs off), per generated token
        body.update(n_probs=int(request.logprobs), post_sampling_probs=False)
        body["response_fields"] = body["response_fields"] + ["completion_probabilities"]
    if getattr(request, "stop", ()) or getattr(request, "stream", False):  # the text, cut before a stop string
        body.update(stop=list(request.stop), stream=bool(request.stream))
        body["response_fields"] = body["response_fields"] + ["content"]
        if request.stream:  # every event whole: the chunks' tokens and content are what is checked
            del body["response_fields"]
    return body


def merged_stream(data: bytes) -> dict:
    """A streamed ``/completion``'s server-sent events put together: ``tokens`` and ``content`` concatenated in
    order, the other fields (``stop_type``, ``timings``) from the last event; raises on an event that is not JSON or
    a stream without its final event (``stop``: true)."""
    events = sse_events(data, "llama-server")
    if not events or not events[-1].get("stop"):
        raise RuntimeError(f"llama-server's stream ended without its final event ({len(events)} events)")
    out = dict(events[-1])
    out["tokens"] = [int(t) for e in events for t in e.get("tokens") or []]
    out["content"] = "".join(e.get("content") or "" for e in events)
    out["events"] = len(events)
    return out


def returned_logprobs(response: dict) -> dict:
    """``{"logprobs": [{"id": logprob, ...} per generated token]}`` from ``completion_probabilities`` (the sampled
    token's ``logprob`` and its ``top_logprobs``), or {} where the response has none."""
    probs = response.get("completion_probabilities")
    if probs is None:
        return {}
    out = []
    for p in probs:
        entry = {str(int(t["id"])): float(t["logprob"]) for t in p.get("top_logprobs") or []}
        entry[str(int(p["id"]))] = float(p["logprob"])
        out.append(entry)
    return {"logprobs": out}


def server_args(cfg: Configuration, draft: str | None, *, ctx_per_slot: int = 128) -> list[str]:
    """The configuration's ``llama-server`` flags (beyond model, host, port and the fixed ones of :class:`Server`)."""
    o = cfg.options
    parallel = int(o.get("parallel", 1))
    args = ["-np", str(parallel), "-c", str(ctx_per_slot * parallel)]
    if o.get("draft_model"):
        if not draft:
            raise ValueError(f"{cfg.name}: needs a draft model")
        args += ["-md", str(draft), "-td", "1", "-tbd", "1", "-ctkd", "f32", "-ctvd", "f32",
                 "--spec-draft-n-max", str(o.get("draft_max", 3)), "--spec-draft-n-min", str(o.get("draft_min", 0)),
                 "--spec-draft-p-min", str(o.get("p_min", 0.0))]
    elif o.get("spec_type") == "draft-mtp":  # the MTP layers are the target's own
        args += ["--spec-draft-n-max", str(o.get("draft_max", 3)), "--spec-draft-n-min", str(o.get("draft_min", 0)),
                 "--spec-draft-p-min", str(o.get("p_min", 0.0))]
    if o.get("backend_sampling") is False:
        args += ["--no-spec-draft-backend-sampling"]
    if o.get("spec_type"):
        args += ["--spec-type", o["spec_type"]]
    for flag, value in (o.get("flags") or {}).items():
        args += [flag, str(value)]
    return args


#: Serving-condition knobs llama-server has no counterpart for (:attr:`EngineAdapter.absent_knobs`).
ABSENT_KNOBS = {"block_size": "llama.cpp's KV cache is not paged: a slot's cells are contiguous, its prompt cache "
                              "reuses any common prefix"}
#: The knobs mapped: ``prefix_caching`` -> each request's ``cache_prompt``, ``max_model_len`` -> ``-c`` per slot,
#: ``context_shift`` -> ``--context-shift`` (off by default).
MAPPED_KNOBS = ("prefix_caching", "max_model_len", "context_shift")


def condition_settings(condition) -> dict:
    """The condition's knobs llama-server runs with; raises naming a knob it has no setting for (a token budget:
    ``-b`` / ``-ub`` exist, but the server reports no chunking to prove it reached; a KV pool: it never preempts)."""
    missing = sorted(set(condition.settings) - set(MAPPED_KNOBS) - set(ABSENT_KNOBS))
    if missing:
        raise NotImplementedError(f"llama-server has no mapped setting for {', '.join(missing)} ({condition.name})")
    return {k: v for k, v in condition.settings.items() if k in MAPPED_KNOBS}


def parse_metrics(text: str) -> dict:
    """``/metrics`` (Prometheus text) -> the runner's counters."""
    val = {}
    per_pos = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r'llamacpp:(\w+)(?:\{position="(\d+)"\})?\s+(\S+)', line)
        if not m:
            continue
        if m.group(2) is not None:
            per_pos[int(m.group(2))] = int(float(m.group(3)))
        else:
            val[m.group(1)] = float(m.group(3))
    return {"drafts": int(val.get("spec_decode_num_drafts_total", 0)),
            "draft_tokens": int(val.get("spec_decode_num_draft_tokens_total", 0)),
            "accepted": int(val.get("spec_decode_num_accepted_tokens_total", 0)),
            "accepted_per_pos": [per_pos[i] for i in sorted(per_pos)] if per_pos else None}


# ----------------------------------------------------------------------------- the server process


class Server(HttpServer):
    """One ``llama-server`` on 127.0.0.1 (:class:`conformance.engines.serving.HttpServer`: a child of this process, in
    its process group, never a new session)."""

    def __init__(self, binary, model, *, parallel: int = 1, args=(), log_dir: str | None = None):
        self.binary, self.model, self.parallel = str(binary), str(model), int(parallel)
        self.args = list(args) or ["-np", str(parallel), "-c", str(128 * parallel)]
        super().__init__("llama-server", [self.binary, "-m", self.model, "--host", "127.0.0.1", "--port", "{port}",
                                          "-t", "1", "-tb", "1", "-ctk", "f32", "-ctv", "f32", "-fa", "off",
                                          "--metrics", "--no-webui", *self.args],
                         start_timeout_s=START_TIMEOUT_S, request_timeout_s=REQUEST_TIMEOUT_S, log_dir=log_dir)

    def log_errors(self, n: int = 4) -> str:
        """The server log's error lines (level ``E``, ``GGML_ASSERT``, ``... MTP layers``), timestamps and the
        build's path stripped: what a refused set-up says, the same on every machine."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        keep = [re.sub(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ", "", re.sub(r"^/\S*?/src/(?=ggml/|src/|common/|tools/)", "", ln)).strip()
                for ln in lines if re.match(r"^\d+\.\d+\.\d+\.\d+ E ", ln) or "GGML_ASSERT" in ln
                or "doesn't contain" in ln]
        return " | ".join(dict.fromkeys(keep[:n]))

    def log_count(self, text: str) -> int:
        """Lines of the server log holding ``text`` (the log is the server's own record of events it has no counter
        for, e.g. each context shift)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return sum(text in line for line in f)
        except OSError:
            return 0

    def failure_text(self) -> str:
        return (f"{self.log_errors() or self.log_tail(6)} "
                f"({' '.join(self.command[2:]).replace('{port}', str(self.port))})")

    def start(self) -> None:
        try:
            super().start()
        except RuntimeError as exc:
            raise RuntimeError(f"llama-server did not become healthy: {str(exc).split(': ', 1)[-1]}") from None

    def _call(self, method: str, path: str, body: bytes | None = None, timeout: float = REQUEST_TIMEOUT_S) -> bytes:
        return self.call(method, path, body, timeout)

    def complete(self, body: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
        data = self._call("POST", "/completion", json.dumps(body).encode(), timeout)
        return merged_stream(data) if body.get("stream") else json.loads(data)

    def metrics(self) -> dict:
        return parse_metrics(self._call("GET", "/metrics").decode())


# ----------------------------------------------------------------------------- the session


class LlamaCppSession(VariantSession):
    """One configuration on one target family: up to two servers (the ``eos`` and ``plain`` GGUF variants),
    each started on first use."""

    settings: dict | None = None  # a serving condition's mapped knobs (None: the matrix's plain set-up)
    cache_hits = 0  # prompt tokens the slots' caches served, summed over responses (under a condition)

    def __init__(self, cfg: Configuration, pair, *, log_dir: str | None = None, condition=None):
        from .gguf_export import export

        super().__init__()
        self.cfg, self.pair = cfg, pair
        self.settings = condition_settings(condition) if condition is not None else None
        self.cache_hits, self._lock = 0, threading.Lock()
        if cfg.options.get("head") == "eagle3":  # the head and the deep target it reads (same table as the target)
            from .gguf_heads import DEEP, HEAD, export_eagle3

            if pair.target.name != "order1-target":
                raise ValueError(f"{cfg.name}: the EAGLE-3 head is written for order1-target, not {pair.target.name}")
            self.paths, self.models = export_eagle3(), (DEEP, HEAD)
        elif cfg.options.get("head") == "mtp":  # the order-1 table in a qwen35 target with its MTP block
            from .gguf_heads import MTP, export_mtp

            if pair.target.name != "order1-target":
                raise ValueError(f"{cfg.name}: the MTP target is written for order1-target, not {pair.target.name}")
            self.paths, self.models = export_mtp(), (MTP, MTP)
        else:
            self.paths, self.models = export((pair.target.name, pair.draft.name)), (pair.target.name, pair.draft.name)
        self.parallel = int(cfg.options.get("parallel", 1))
        self.threads = max(2, min(2 * self.parallel, 8))
        self.log_dir = log_dir  # None: each server's own temporary folder, removed when it stops
        if cfg.options.get("start_at_open"):  # a set-up llama.cpp refuses: its error is the row's load error
            self.instance("plain")

    def load(self, variant: str) -> Server:
        target, draft = (self.paths[(m, variant)] for m in self.models)
        ctx = int((self.settings or {}).get("max_model_len", 128))
        args = server_args(self.cfg, draft if self.cfg.options.get("draft_model") else None, ctx_per_slot=ctx)
        if (self.settings or {}).get("context_shift"):
            args.append("--context-shift")
        srv = Server(server_binary(), target, parallel=self.parallel, args=args, log_dir=self.log_dir)
        srv.start()
        return srv

    def one(self, srv: Server, request) -> dict:
        body = completion_payload(request)
        if self.settings is not None:  # under a condition: its prompt caching, and what the cache served
            body["cache_prompt"] = bool(self.settings.get("prefix_caching", True))
            body["response_fields"] = body["response_fields"] + ["timings/cache_n", "truncated", "timings/predicted_ms"]
        if request.n > 1:  # n_cmpl: child tasks on free slots, the j-th seeded seed + j; one result per completion
            body["n_cmpl"] = int(request.n)
            body["response_fields"] = body["response_fields"] + ["index"]
            results = srv.complete(body)
            if not isinstance(results, list) or len(results) != request.n:
                raise RuntimeError(f"llama-server returned {len(results) if isinstance(results, list) else 1} results "
                                   f"for n_cmpl={request.n}")
            return {"samples": [{**self._record(r), "index": int(r.get("index", j))} for j, r in enumerate(results)]}
        return self._record(srv.complete(body))

    def _record(self, r: dict) -> dict:
        toks = [int(t) for t in r.get("tokens") or []]
        out = {"completion_ids": toks, "finish_reason": FINISH.get(r.get("stop_type")), **returned_logprobs(r)}
        if "content" in r:
            out["text"] = r["content"]
        if self.settings is not None:
            cached = int(r.get("timings/cache_n", (r.get("timings") or {}).get("cache_n")) or 0)
            out["cached_tokens"] = cached
            predicted = r.get("timings/predicted_ms", (r.get("timings") or {}).get("predicted_ms"))
            if predicted is not None:  # the server's own time from the first generated token on (profiles read it)
                out["decode_s"] = round(float(predicted) / 1e3, 6)
            if self.settings.get("context_shift"):  # the slot's context was shifted (the prompt fits: never cut)
                out["context_shifted"] = int(bool(r.get("truncated")))
            with self._lock:
                self.cache_hits += cached
        if self.cfg.speculative:
            t = r.get("timings") or {}  # response_fields flattens the paths: "timings/draft_n" (absent: no drafts)
            out.update(draft_tokens=int(r.get("timings/draft_n", t.get("draft_n")) or 0),
                       accepted=int(r.get("timings/draft_n_accepted", t.get("draft_n_accepted")) or 0))
        return out

    def counters(self) -> dict | None:
        if not self.cfg.speculative:
            return None
        tot = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": None}
        for srv in self.instances.values():
            m = srv.metrics()
            for k in ("drafts", "draft_tokens", "accepted"):
                tot[k] += m[k]
            if m["accepted_per_pos"] is not None:
                cur = tot["accepted_per_pos"] or [0] * len(m["accepted_per_pos"])
                tot["accepted_per_pos"] = [a + b for a, b in zip(cur, m["accepted_per_pos"])]
        k = int(self.cfg.k or 0)
        if k and tot["accepted_per_pos"] is None:  # the per-position series appears with the first verification
            tot["accepted_per_pos"] = [0] * k
        return tot

    def condition_counters(self) -> dict:
        """What llama-server reports of a serving condition: the prompt tokens its slots' caches served (each
        response's ``timings.cache_n``, summed) and the context per slot it runs with (``/props``)."""
        out = {"prefix_cache_hits": self.cache_hits, "context_shifts": 0}
        for srv in self.instances.values():
            props = json.loads(srv._call("GET", "/props"))
            out["max_model_len"] = int(props["default_generation_settings"]["n_ctx"])
            out["context_shifts"] += srv.log_count("slot context shift")
        return out

    def validate(self, request) -> None:
        completion_payload(request)

    def unload(self, srv: Server) -> None:
        srv.stop()


class LlamaCppAdapter(EngineAdapter):
    def python(self) -> str:
        server_binary()  # raises EngineMissingError, naming the build command
        try:
            import gguf  # noqa: F401
        except ImportError as exc:
            raise EngineMissingError(f"the GGUF writer (gguf) is not importable here: run `{INSTALL}`") from exc
        return sys.executable

    def installed_version(self) -> str:
        out = subprocess.run([str(server_binary()), "--version"], capture_output=True, text=True, timeout=30)
        build = re.search(r"version: (\S+)", out.stdout + out.stderr)
        if not build:
            raise RuntimeError(f"llama-server --version printed no version: {(out.stdout + out.stderr)[:200]}")
        return VERSION  # the sdist pins the vendored source; its build number is in engine_home()/server-version.txt

    def open(self, cfg, family):
        from specdec_ref.exact import exact_pair

        return LlamaCppSession(cfg, exact_pair(self.families[family]))

    def open_condition(self, cfg, family, condition):
        from specdec_ref.exact import exact_pair

        return LlamaCppSession(cfg, exact_pair(self.families[family]), condition=condition)

    def export(self, check: bool = True) -> list[dict]:
        """The GGUF files (targets, drafts, the EAGLE-3 head and its deep target, the ``qwen35`` target with its MTP
        block, each in its ``eos`` and ``plain`` variant) and, with ``check``, their probabilities through
        llama-server against the tables."""
        from .gguf_export import MODELS, export, report
        from .gguf_heads import export_eagle3, export_mtp

        written = {**export(MODELS), **export_eagle3(), **export_mtp()}
        if not check:
            return [{"model": name, "variant": variant, "passed": path.exists(), "text": f"{name} {variant}: {path}"}
                    for (name, variant), path in written.items()]
        rows = check_gguf()
        return [{**r, "text": report([r])} for r in rows]


ADAPTER = LlamaCppAdapter(
    name="llamacpp", title="llama.cpp (llama-server)", version=VERSION, install=INSTALL, configurations=CONFIGS, k=3,
    cases=MAIN + ("penalty", "logit-bias", "logprobs", "n-samples") + TEXT_CASES + GRAMMAR_CASES, timeout_s=900.0,
    seed_probe=True, preload_modules=(__name__,),
    conditions={"prefix-cache": ("control-cold", "control", "draft-k3"), "context-edge": ("control", "draft-k3"),
                "context-shift": ("control", "draft-k3", "ngram-simple"),
                "long-prefix-cache": ("control", "draft-k3"),
                "distinct-prompts": ("control-cold", "control", "draft-k3", "ngram-simple"),
                "multi-turn": ("control-cold", "control", "draft-k3"),
                "long-context-edge": ("control", "draft-k3")},
    absent_knobs=ABSENT_KNOBS,
    conventions=Conventions(
        top_k_ties="lowest_ids", first_token_at_prefill=True, seeds="per_request", drafts_to_end=True, logprobs="raw",
        eos_draft="target", token_prefix="", drafts_fit_context=True,
        notes=("sampler chain set per request: penalties, temperature, top-k, top-p, min-p (llama.cpp's default "
               "applies the temperature last)",
               "top-k keeps exactly k; tied tokens are chosen by std::partial_sort's heap, not by a stated rule (not "
               "the lowest ids in general); on every row these cases reach its law is the lowest-ids law (checked "
               "row by row in engine_tests/test_llamacpp.py)",
               "penalties count the prompt (presence and frequency too; the reference: generated tokens only): the "
               "penalty case runs alone in penalty-window",
               "ignore_eos bans EOS (logit bias -inf): cases with EOS as an ordinary token run on a GGUF whose token "
               "7 is not end-of-generation; a sampled EOS that stops is returned in tokens",
               "verification is sample-and-match for every --spec-type: per seed identical to no speculation")),
)


def check_gguf(names=None) -> list[dict]:
    """The GGUF files' probabilities against the tables through this build's llama-server
    (:func:`conformance.engines.llamacpp.gguf_export.check_logits`)."""
    from . import gguf_export

    binary = server_binary()
    return gguf_export.check_logits(
        lambda path: Server(binary, path, args=["-np", "1", "-c", str(gguf_export.context_size(path))]),
        names or gguf_export.CHECKED)
