"""The ONNX Runtime GenAI adapter: ``onnxruntime-genai==0.18.0`` (CPU wheel), its own model builder and generator.

    bash scripts/env.sh onnxgenai                          # the venv (.venv-onnxgenai)
    python -m conformance.engines export onnxgenai      # convert (in .venv-onnxgenai), logits against the tables
    python -m conformance.engines onnxgenai --out DIR [--configs a,b] [--check-expected]

Everything but the engine calls is the shared runner's (:mod:`conformance.engines.runner`). The exactly-known
checkpoints are converted by ORT GenAI's builder (``python -m onnxruntime_genai.models.builder -p fp32 -e cpu``,
cached outside the clone by version and checkpoint hash: :func:`export`); a session composes, per configuration and
target family, a model folder whose ``genai_config.json`` holds the target decoder, the draft decoder
(``model.draft``) and the ``speculative`` options, and runs every request as its own ``og.Generator`` (speculation
is batch 1 only in ORT GenAI), two requests at a time from a thread pool.

Conventions (declared, each checked by ``engine_tests/test_onnxgenai.py``):

* top-k keeps exactly k tokens: ``ComputeSampledCategorical`` takes the k largest by ``std::partial_sort`` (libstdc++
  heap selection), then the temperature, then top-p inside the top k. On every top-k the matrix runs (k = 2 through a
  tie) the heap keeps the lowest ids (``top_k_ties="lowest_ids"``); it is no stated rule: on 5 of the 42 (row, k)
  pairs of ``order1-target`` with a tie at the k-th place the heap keeps a higher id (the engine test reproduces the
  kept sets with a model of the heap);
* no ``min_p``, ``presence_penalty`` or ``frequency_penalty`` search option: the ``min-p`` and ``penalty`` cases are
  refused (``repetition_penalty`` exists, on prompt and output, the Hugging Face rule);
* EOS: a sampled EOS ends the generator and ``get_sequence()`` drops it (a finding); the adapter reads every token
  with ``get_next_tokens()``, so a completion that stops at EOS holds it. ORT GenAI has no ``ignore_eos``
  (``eos_token_id: []`` falls back to ``pad_token_id``, and an id outside the vocabulary is refused), so requests
  where EOS is an ordinary token run on a *plain* export whose logits gain a ninth token of logit -1e30, declared EOS
  (probability 0: never sampled; the first eight logits are the tables' own);
* ``random_seed`` per request seeds its ``std::mt19937`` (unseeded requests set none: a random device seed);
* speculative rounds start from the prompt (the first token may be an accepted draft): ``first_token_at_prefill``
  False.

Speculation (read in ``src/speculative_decoding_strategy.cpp`` and ``src/speculative_sampling.h``): a draft model
(``model.draft``) proposes ``max_draft_tokens`` tokens, each sampled from the draft's own warped law (same
temperature / top-k / top-p); the target accepts draft ``i`` with probability ``min(1, p/q)`` and replaces the first
rejected one by a sample of ``max(p - q, 0)`` (all accepted: a bonus sample): token-wise rejection sampling, scheme
``token``. N-gram proposals are deterministic and verified by *sample-and-match* (the target samples each position
with the request's generator, drafts are kept while equal), so a seed's output equals plain sampling's:
``identical_to="control"``. Greedy: drafts kept while equal to the target's argmax. Counters:
``Generator.get_speculative_stats()`` (per generator: rounds, proposed, evaluated and accepted draft tokens) gives
per-request totals; the adapter reads it after every token, so each round's accepted count (and from it the
per-position counts) is known. ORT shortens a round to the tokens left before ``max_length``; the efficiency
request set therefore runs with ``max_length`` k + 1 tokens beyond its ``max_new_tokens`` and is stopped by the
adapter, so its rounds have exactly k drafts as the exact expectation assumes (the law cases use the exact
``max_length``: the engine's own end-of-budget path).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from ..adapter import REPO, Conventions, EngineAdapter, venv_python
from ..session import VariantSession
from ..matrix import CASES, Configuration

__all__ = ["ADAPTER", "CONFIGS", "VERSION", "MODELS", "ABSENT_KNOBS", "MAPPED_KNOBS", "engine_home", "export",
           "check_logits", "compose_config", "search_options", "condition_settings", "stated_context",
           "partial_sort_top_k", "OnnxGenaiSession", "RoundCounter"]

VERSION = "0.18.0"
INSTALL = "bash scripts/env.sh onnxgenai"
VENV = ".venv-onnxgenai"
MODELS = ("order1-target", "order1-draft-close", "order2-target", "order2-draft")
PLAIN_LOGIT = -1e30  # the plain variant's extra token: probability exactly 0 after softmax in float32
THREADS = 2

#: Every matrix case; ``min-p`` and ``penalty`` are refused (no such search options).
ALL = tuple(c.name for c in CASES)
LAW = tuple(n for n in ALL if n not in ("min-p", "penalty"))
#: The control runs what the per-seed identity checks need, the tie case and the refused ones (stage time: every
#: request is its own Generator, about 1 ms each here); draft-k3 runs every expressible case.
CONTROL = ("warp-1tok", "ties", "position", "greedy-1tok", "greedy", "min-p", "penalty")
SHORT = ("warp-1tok", "position", "greedy")
#: The request-feature cases (:data:`conformance.engines.matrix.FEATURE_CASES`): ``min_new_tokens`` as ``min_length``
#: (prompt included); no ``logit_bias`` search option (refused).
FEATURES = ("min-tokens", "logit-bias")


def _draft(**o) -> dict:
    return {"draft": True, "speculative": o}


CONFIGS: tuple[Configuration, ...] = (
    Configuration("control", None, {}, cases=CONTROL + FEATURES, note="no speculation"),
    Configuration("draft-k3", "draft_model", _draft(max_draft_tokens=3), "token", cases=LAW + ("min-tokens",), k=3,
                  sampled_proposer="draft",
                  note="draft model (model.draft), max_draft_tokens 3; its per-request rounds placed in the completions "
                       "and their acceptance per position against the exact expectation given each round's text"),
    Configuration("draft-k1", "draft_model", _draft(max_draft_tokens=1), "token", cases=("warp-1tok", "greedy-1tok"),
                  k=1, note="draft model, max_draft_tokens 1"),
    Configuration("draft-k5", "draft_model", _draft(max_draft_tokens=5), "token", cases=("position", "greedy"), k=5,
                  note="draft model, max_draft_tokens 5"),
    Configuration("greedy", "draft_model", _draft(max_draft_tokens=3), "token", cases=("greedy-1tok", "greedy"),
                  identical_to="control", k=3, note="draft model k 3, greedy: per request identical to plain greedy"),
    Configuration("draft-adaptive", "draft_model", _draft(max_draft_tokens=3, min_adaptive_k=2), None,
                  cases=("warp-1tok",), k=16,
                  note="draft model, adaptive K (min_adaptive_k 2, up to 16; timing-driven: no exact acceptance law)"),
    Configuration("ngram", "ngram", {"speculative": {"ngram_size": 2, "max_draft_tokens": 3}}, None, cases=SHORT,
                  identical_to="control", k=3, scale=0.25,
                  note="n-gram lookup (ngram_size 2, max_draft_tokens 3): sample-and-match, per seed identical "
                       "(the first quarter of each case's seeds)"),
)


#: Serving-condition knobs ORT GenAI has no counterpart for (:attr:`EngineAdapter.absent_knobs`).
ABSENT_KNOBS = {"block_size": "ORT GenAI's KV cache is not paged: each generator holds one buffer of the model's "
                              "context_length"}
#: The knobs mapped: ``max_model_len`` -> the exported model's ``context_length`` (128; each request's ``max_length``
#: stays prompt + max tokens, which the engine refuses past that context), ``prefix_caching`` off only (no prefix
#: cache: every generator prefills its prompt).
MAPPED_KNOBS = ("max_model_len", "prefix_caching")
EXPORTED_CONTEXT = 128


def condition_settings(condition) -> dict:
    """The condition's knobs as ORT GenAI runs them; raises naming a knob it has no setting for (a token budget, a
    KV pool: one generator per request, nothing scheduled), prefix caching on (it has none), or a context other than
    the export's."""
    missing = sorted(set(condition.settings) - set(MAPPED_KNOBS) - set(ABSENT_KNOBS))
    if missing:
        raise NotImplementedError(f"ONNX Runtime GenAI has no setting for {', '.join(missing)} ({condition.name})")
    if condition.settings.get("prefix_caching"):
        raise NotImplementedError(f"ONNX Runtime GenAI has no prefix cache ({condition.name})")
    limit = condition.settings.get("max_model_len")
    if limit is not None and int(limit) != EXPORTED_CONTEXT:
        raise NotImplementedError(f"max_model_len {limit}: the exports' context_length is {EXPORTED_CONTEXT} "
                                  f"({condition.name})")
    return {k: v for k, v in condition.settings.items() if k in MAPPED_KNOBS}


def stated_context(model) -> int | None:
    """The context the engine enforces, in its own words: a request one position past any plausible context is
    refused with "max_length (N) cannot be greater than model context_length (C)"; C, or None when it says
    otherwise (then the condition is not shown reached)."""
    import re

    import onnxruntime_genai as og

    p = og.GeneratorParams(model)
    try:
        p.set_search_options(max_length=1 << 20, do_sample=False)
        og.Generator(model, p)
    except Exception as exc:  # noqa: BLE001 - the refusal is the reading
        m = re.search(r"context_length \((\d+)\)", str(exc))
        return int(m.group(1)) if m else None
    return None


# ----------------------------------------------------------------------------- conversion (the builder), cached


def engine_home() -> Path:
    root = os.environ.get("SPECDEC_CACHE") or str(Path.home() / ".cache" / "specdec-ref")
    return Path(root) / f"onnxgenai-{VERSION}"


def _asset(name: str) -> Path:
    return REPO / "specdec_ref" / "assets" / "exact" / name


def _checkpoint_key(name: str) -> str:
    h = hashlib.sha256()
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        h.update((_asset(name) / f).read_bytes())
    return h.hexdigest()[:12]


def _plain_variant(src: Path, dst: Path) -> None:
    """``dst``: the export ``src`` with a ninth logit of value :data:`PLAIN_LOGIT`, declared EOS (and pad)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    shutil.copytree(src, dst)
    model = onnx.load(str(dst / "model.onnx"), load_external_data=False)
    g = model.graph
    out = next(o for o in g.output if o.name == "logits")
    for node in g.node:
        node.output[:] = ["logits_tables" if x == "logits" else x for x in node.output]
    g.initializer.extend([numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 1], dtype=np.int64), "plain_pads"),
                          numpy_helper.from_array(np.array(PLAIN_LOGIT, dtype=np.float32), "plain_value")])
    g.node.append(helper.make_node("Pad", ["logits_tables", "plain_pads", "plain_value"], ["logits"], mode="constant"))
    dims = out.type.tensor_type.shape.dim
    vocab = dims[-1].dim_value
    dims[-1].dim_value = vocab + 1
    assert out.type.tensor_type.elem_type == TensorProto.FLOAT
    onnx.save(model, str(dst / "model.onnx"))
    cfg = json.loads((dst / "genai_config.json").read_text())
    cfg["model"].update(vocab_size=vocab + 1, eos_token_id=vocab, pad_token_id=vocab)
    (dst / "genai_config.json").write_text(json.dumps(cfg, indent=1))


def export(names=MODELS, *, python: str | None = None, log=print) -> dict:
    """``{(name, variant): folder}`` for ``variant`` in ``eos`` (the builder's export) and ``plain``; converted once
    per (version, checkpoint) under :func:`engine_home` (``models/<name>-<hash>/``)."""
    out = {}
    for name in names:
        base = engine_home() / "models" / f"{name}-{_checkpoint_key(name)}"
        eos, plain = base / "eos", base / "plain"
        if not (eos / "genai_config.json").exists():
            tmp = base / "tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.parent.mkdir(parents=True, exist_ok=True)
            cmd = [python or sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", name, "-i",
                   str(_asset(name)), "-o", str(tmp), "-p", "fp32", "-e", "cpu", "-c", str(base / "hf-cache")]
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if run.returncode != 0 or not (tmp / "genai_config.json").exists():
                tail = (run.stdout + run.stderr).strip().splitlines()[-5:]
                raise RuntimeError(f"the ORT GenAI builder failed on {name}: {' | '.join(tail)}")
            shutil.rmtree(base / "hf-cache", ignore_errors=True)
            shutil.rmtree(eos, ignore_errors=True)
            tmp.rename(eos)
            log(f"converted {name} -> {eos}")
        if not (plain / "genai_config.json").exists():
            shutil.rmtree(plain, ignore_errors=True)
            _plain_variant(eos, plain)
        out[(name, "eos")], out[(name, "plain")] = eos, plain
    return out


def _contexts(name: str) -> list[list[int]]:
    """Contexts whose next-token logits are checked: every row, then longer random paths (KV cache, positions)."""
    import random

    rnd = random.Random(7)
    if name.startswith("order2"):
        return [[6]] + [[6] + [rnd.randrange(6) for _ in range(n)] for n in (1, 2, 3, 5, 8, 12, 17)]
    return [[a] for a in range(8)] + [[rnd.randrange(8) for _ in range(n)] for n in (2, 3, 5, 9, 14)]


def check_logits(paths: dict) -> list[dict]:
    """The engine's next-token logits (``Generator.get_logits()``: the whole context appended at once, then one
    token at a time through the KV cache) against ``exact_model(name).next_logits``, per model and variant."""
    import numpy as np
    import onnxruntime_genai as og

    from specdec_ref.exact import exact_model

    rows = []
    for (name, variant), folder in sorted(paths.items()):
        model = og.Model(str(folder))
        em = exact_model(name)
        worst, positions, exact = 0.0, 0, 0
        for ctx in _contexts(name):
            want = np.asarray(em.next_logits([ctx[:i] for i in range(1, len(ctx) + 1)]), dtype=np.float64)
            p = og.GeneratorParams(model)
            p.set_search_options(max_length=len(ctx) + 2, do_sample=False)
            g = og.Generator(model, p)
            got = []
            for t in ctx:  # one token at a time: prefill of one, then the KV cache
                g.append_tokens(np.array([t], dtype=np.int32))
                got.append(np.asarray(g.get_logits(), dtype=np.float64).reshape(-1))
            whole = og.Generator(model, p)
            whole.append_tokens(np.array(ctx, dtype=np.int32))
            got_whole = np.asarray(whole.get_logits(), dtype=np.float64).reshape(-1)
            got = np.stack(got)
            if variant == "plain":
                assert np.all(got[:, -1] == np.float32(PLAIN_LOGIT)) and got_whole[-1] == np.float32(PLAIN_LOGIT)
                got, got_whole = got[:, :-1], got_whole[:-1]
            diff = max(float(np.abs(got - want).max()), float(np.abs(got_whole - want[-1]).max()))
            worst = max(worst, diff)
            positions += len(ctx)
            exact += int((got == want).all(axis=1).sum())
        rows.append({"model": name, "variant": variant, "positions": positions, "bit_exact_positions": exact,
                     "max_abs_diff": worst, "passed": worst < 2e-6})
    return rows


def partial_sort_top_k(scores, k: int) -> set[int]:
    """The token ids ORT GenAI's top-k keeps: ``std::partial_sort(ids, ids + k, ids_end, scores[i] > scores[j])``
    over ``0..V-1`` as libstdc++ runs it (``__heap_select``: a heap of the first k, each later id that beats the
    heap's top replaces it). A model of the engine, for the tie rule: on the matrix's top-k it equals the lowest-ids
    rule, on some tied rows it does not (``engine_tests/test_onnxgenai.py`` compares it with the engine)."""
    ids = list(range(len(scores)))
    if k >= len(ids):
        return set(ids)
    better = lambda i, j: scores[i] > scores[j]  # noqa: E731 - the engine's comparator

    def adjust(heap, hole, n, value):
        top, child = hole, hole
        while child < (n - 1) // 2:
            child = 2 * (child + 1)
            if better(heap[child], heap[child - 1]):
                child -= 1
            heap[hole], hole = heap[child], child
        if n % 2 == 0 and child == (n - 2) // 2:
            child = 2 * (child + 1)
            heap[hole], hole = heap[child - 1], child - 1
        parent = (hole - 1) // 2
        while hole > top and better(heap[parent], value):
            heap[hole], hole = heap[parent], parent
            parent = (hole - 1) // 2
        heap[hole] = value

    heap = ids[:k]
    for parent in range((k - 2) // 2, -1, -1):  # __make_heap
        adjust(heap, parent, k, heap[parent])
    for i in ids[k:]:
        if better(i, heap[0]):  # __pop_heap(first, middle, i)
            adjust(heap, 0, k, i)
    return set(heap)


# ----------------------------------------------------------------------------- the request mapping


def search_options(request, k: int = 0) -> dict:
    """``GeneratorParams.set_search_options`` for one :class:`Request` (``k`` > 0: the efficiency set's headroom)."""
    s = request.sampling
    missing = [n for n, v in (("min_p", s.min_p), ("presence_penalty", s.presence_penalty),
                              ("frequency_penalty", s.frequency_penalty), ("logit_bias", s.logit_bias),
                              ("constraint", s.constraint is not None), ("bad_words", s.bad_words)) if v]
    if missing:
        raise ValueError(f"ONNX Runtime GenAI has no {', '.join(missing)} search option")
    if not s.greedy and s.top_k and getattr(s, "top_k_ties", "all") != "lowest_ids":
        raise ValueError("ORT GenAI's top-k keeps exactly k (heap order): only the lowest-ids rule is declared")
    extra = k + 1 if request.case == "efficiency" and k else 0
    opts = {"max_length": len(request.prompt) + int(request.max_new_tokens) + extra}
    if s.greedy:
        opts["do_sample"] = False
    else:
        opts.update(do_sample=True, temperature=float(s.temperature), top_k=int(s.top_k or 0),
                    top_p=float(s.top_p or 1.0))
    if s.repetition_penalty != 1.0:
        opts["repetition_penalty"] = float(s.repetition_penalty)
    if s.min_new_tokens:  # min_length counts the prompt: EOS masked while prompt + generated < min_length
        opts["min_length"] = len(request.prompt) + int(s.min_new_tokens)
    if request.seed is not None:
        opts["random_seed"] = int(request.seed)
    return opts


def compose_config(target: Path, draft: Path | None, options: dict, out: Path) -> Path:
    """A model folder for ``og.Model``: the target (and draft) exports copied under it (ORT GenAI wants relative
    paths inside the model folder), ``genai_config.json`` with ``model.draft`` and ``speculative``; one ONNX Runtime
    thread per session."""
    cfg = json.loads((target / "genai_config.json").read_text())
    shutil.copytree(target, out / "target")
    cfg["model"]["decoder"]["filename"] = "target/model.onnx"
    cfg["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = 1
    if draft is not None:
        shutil.copytree(draft, out / "draft")
        block = json.loads((draft / "genai_config.json").read_text())["model"]["decoder"]
        block["filename"] = "draft/model.onnx"
        block.setdefault("session_options", {})["intra_op_num_threads"] = 1
        cfg["model"]["draft"] = block
    if options.get("speculative"):
        cfg["speculative"] = dict(options["speculative"])
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (target / f).exists():
            shutil.copy(target / f, out / f)
    (out / "genai_config.json").write_text(json.dumps(cfg, indent=1))
    return out


class RoundCounter:
    """Cumulative counters from per-round readings of ``get_speculative_stats()`` (thread-safe)."""

    def __init__(self, k: int):
        self.k, self.lock = k, threading.Lock()
        self.drafts = self.draft_tokens = self.accepted = 0
        self.per_pos = [0] * k

    def add(self, rounds: list[tuple[int, int]]) -> None:
        with self.lock:
            for proposed, accepted in rounds:
                if proposed <= 0:
                    continue
                self.drafts += 1
                self.draft_tokens += proposed
                self.accepted += accepted
                for j in range(min(accepted, self.k)):
                    self.per_pos[j] += 1

    def read(self) -> dict:
        with self.lock:
            return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                    "accepted_per_pos": list(self.per_pos)}


# ----------------------------------------------------------------------------- the session


class OnnxGenaiSession(VariantSession):
    """One configuration on one target family: up to two ``og.Model`` (the ``eos`` and ``plain`` exports)."""

    threads = THREADS

    def __init__(self, cfg: Configuration, pair, k: int, condition=None):
        super().__init__()
        self.cfg, self.pair, self.k, self.condition = cfg, pair, k, condition
        names = (pair.target.name, pair.draft.name) if cfg.options.get("draft") else (pair.target.name,)
        self.paths = export(names)
        self.tmp = Path(tempfile.mkdtemp(prefix="specdec-onnxgenai-"))
        self.counter = RoundCounter(k)

    def load(self, variant: str):
        import onnxruntime_genai as og

        draft = self.paths[(self.pair.draft.name, variant)] if self.cfg.options.get("draft") else None
        folder = compose_config(self.paths[(self.pair.target.name, variant)], draft, self.cfg.options, self.tmp / variant)
        return og.Model(str(folder))

    def one(self, model, request) -> dict:
        import numpy as np
        import onnxruntime_genai as og

        params = og.GeneratorParams(model)
        params.set_search_options(**search_options(request, self.k if self.cfg.speculative else 0))
        g = og.Generator(model, params)
        g.append_tokens(np.asarray(request.prompt, dtype=np.int32))
        toks, rounds, last = [], [], (0, 0, 0)
        while len(toks) < request.max_new_tokens and not g.is_done():
            g.generate_next_token()
            toks.append(int(g.get_next_tokens()[0]))  # get_sequence() would drop a sampled EOS
            if self.cfg.speculative:
                st = g.get_speculative_stats()
                now = (int(st["rounds"]), int(st["draft_tokens_proposed"]), int(st["draft_tokens_accepted"]))
                if now[0] > last[0]:
                    rounds.append((now[1] - last[1], now[2] - last[2]))
                last = now
            if request.eos and toks[-1] == request.eos_id:
                break
        out = {"completion_ids": toks,
               "finish_reason": "stop" if request.eos and toks and toks[-1] == request.eos_id else "length"}
        if self.cfg.speculative:
            self.counter.add(rounds)
            out.update(draft_tokens=sum(p for p, _ in rounds), accepted=sum(a for _, a in rounds),
                       rounds=[[p, a] for p, a in rounds])
        return out

    def counters(self) -> dict | None:
        return self.counter.read() if self.cfg.speculative else None

    def condition_counters(self) -> dict | None:
        """Under a serving condition, the context each loaded model enforces (:func:`stated_context`; the smallest
        when two variants are loaded)."""
        if self.condition is None:
            return None
        stated = [stated_context(m) for m in self.instances.values()]
        return {"max_model_len": None if not stated or None in stated else min(stated)}

    def validate(self, request) -> None:
        search_options(request)

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class OnnxGenaiAdapter(EngineAdapter):
    def python(self) -> str:
        return venv_python("onnxruntime_genai", VENV, INSTALL)

    def installed_version(self) -> str:
        import onnxruntime_genai as og

        return og.__version__

    def open(self, cfg, family):
        from specdec_ref.exact import exact_pair

        return OnnxGenaiSession(cfg, exact_pair(self.families[family]), self.k_of(cfg))

    def open_condition(self, cfg, family, condition):
        from specdec_ref.exact import exact_pair

        condition_settings(condition)  # a knob without a setting raises here, before any load
        return OnnxGenaiSession(cfg, exact_pair(self.families[family]), self.k_of(cfg), condition=condition)

    def export(self, check: bool = True) -> list[dict]:
        """Every exactly-known model converted by ORT GenAI's builder (cached per version and checkpoint), in its
        ``eos`` and ``plain`` variants, and with ``check`` the engine's logits against the tables (the whole context
        at once, then token by token through the KV cache)."""
        paths = export(log=lambda *a: None)
        if not check:
            return [{"model": n, "variant": v, "passed": True, "text": f"{n} {v}: {p}"} for (n, v), p in paths.items()]
        return [{**r, "text": f"{r['model']:20s} {r['variant']:5s} positions {r['positions']:3d}, bit-exact "
                 f"{r['bit_exact_positions']:3d}, max |logit - table| {r['max_abs_diff']:.2e}"}
                for r in check_logits(paths)]


ADAPTER = OnnxGenaiAdapter(
    name="onnxgenai", title="ONNX Runtime GenAI", version=VERSION, install=INSTALL, configurations=CONFIGS, k=3,
    cases=ALL + FEATURES, timeout_s=900.0, seed_probe=True, preload_modules=("onnxruntime_genai", __name__),
    conditions={"context-edge": ("control", "draft-k3")}, absent_knobs=ABSENT_KNOBS,
    conventions=Conventions(
        top_k_ties="lowest_ids", first_token_at_prefill=False, seeds="per_request",
        notes=("top-k keeps exactly k: std::partial_sort's heap keeps the lowest ids among tied tokens on every "
               "top-k of the matrix (k = 2); no stated rule (5 of 42 tied (row, k) pairs of order1-target keep a "
               "higher id)",
               "no min_p, presence or frequency penalty: the min-p and penalty cases are refused",
               "get_sequence() drops a sampled EOS: tokens are read with get_next_tokens(); no ignore_eos: "
               "EOS-as-ordinary cases run on an export with a ninth, never-sampled EOS token",
               "rounds start from the prompt; one Generator per request (speculation is batch 1)",
               "draft model: token-wise rejection sampling; n-gram: sample-and-match, per seed identical")),
)
