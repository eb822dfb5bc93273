"""The mistral.rs adapter: ``mistralrs==0.9.5`` (a prebuilt wheel), in-process ``Runner``, streamed chat requests.

    bash scripts/env.sh mistralrs                      # .venv-mistralrs (0.9.5) and .venv-mistralrs-060 (0.6.0)
    python -m conformance.engines mistralrs --out DIR [--configs a,b] [--check-expected]
    python -m conformance.engines conformance.engines.mistralrs:ADAPTER_060 --out DIR    # 0.6.0's draft model

Everything but the engine calls is the shared runner's (:mod:`conformance.engines.runner`). Per configuration and
target family the session prepares a model folder from the exactly-known checkpoint (a copy; only tokenizer and
config files change, see below), loads ``mistralrs.Runner(Which.Plain(folder, arch=Architecture.Mistral,
dtype=F32), no_paged_attn=True)`` and keeps up to :data:`IN_FLIGHT` streamed ``ChatCompletionRequest`` in flight
(``Runner`` takes one blocking call at a time, ``RuntimeError: Already borrowed`` from a second thread; streams are
the only way to let its scheduler batch), reading every token from the stream's ``logprobs``.

How the adapter meets the engine (each for a finding of docs/mistralrs-verdict.md, reproduced by
``engine_tests/test_mistralrs.py``): ``arch=Architecture.Mistral`` (its Llama loader ignores ``head_dim``); the
folder's ``tokenizer.json`` gets a ``ByteLevel`` decoder and a verbatim chat template; prompts are sent as streamed
chat requests, without their leading ``<bos>`` (the tokenizer adds it and would double a spelled one); a stop at EOS
is appended from ``finish_reason "stop"`` (a sampled special token is in neither the text nor the stream), and
requests where EOS is an ordinary token run on a *plain* folder whose ``<eos>`` is an ordinary word and whose
declared EOS is a never-sampled ``<stop>`` (id 8).

Conventions: nothing can be seeded (``seeds="none"``); top-k keeps exactly k with no stated choice among tied tokens
(``top_k_ties="unstated"``: every case whose law depends on the tie rule is left out, :data:`TIE_DEPENDENT`);
temperature, then top-k, top-p on the renormalised top k, min-p relative to the largest probability; presence and
frequency penalties come *before* the repetition penalty (the reference applies repetition first), so the
``penalty`` case is a different law by definition and runs alone in ``penalty-order``. 0.6.0 (:data:`ADAPTER_060`,
its draft-model speculation) takes one stream at a time, without logprobs (tokens read from the streamed text), and
its expectations are recorded per CPU (``cpu_features``: it dies at load without GFNI).
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from ..adapter import REPO, Conventions, EngineAdapter, EngineMissingError
from ..session import VariantSession
from ..matrix import CASES, Configuration

__all__ = ["ADAPTER", "ADAPTER_060", "CONFIGS", "CONFIGS_060", "VERSION", "OLD_VERSION", "prepare_folder",
           "prompt_text", "split_text", "chat_kwargs", "check_logprobs", "penalty_order_fit", "MistralrsSession"]

VERSION = "0.9.5"
OLD_VERSION = "0.6.0"
INSTALL = "bash scripts/env.sh mistralrs"
VENV, VENV_OLD = ".venv-mistralrs", ".venv-mistralrs-060"
IN_FLIGHT = 256
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
DECODER = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
STOP = "<stop>"

#: The matrix cases whose law depends on the top-k tie rule (their top-k cuts a tie group on a visited row: ``ties``,
#: and, through top-p's normalisation over the kept set, ``warp-1tok`` / ``warp`` on row 4 at k = 4 and the order2
#: ``position`` cases), computed in ``tests/test_mistralrs_adapter.py``. With no stated rule their law is undefined:
#: they are left out (the runner drops only ``ties``, the one the matrix marks).
TIE_DEPENDENT = ("warp-1tok", "warp", "ties", "position-1tok", "position")
#: Every other matrix case but ``penalty`` (a different definition, run alone).
MAIN = tuple(c.name for c in CASES if c.name not in TIE_DEPENDENT + ("penalty",))

CONFIGS: tuple[Configuration, ...] = (
    Configuration("control", None, {}, cases=MAIN, note="plain sampling (no speculation on CPU)"),
    Configuration("penalty-order", None, {}, cases=("penalty",),
                  note="the penalty case alone: presence is subtracted before the repetition penalty (a different "
                       "law by definition, recorded)"),
    Configuration("mtp", "mtp", {"mtp": True, "mtp_n_predict": 3}, None, cases=("eos",), k=3,
                  note="MTP speculation (the pair's draft as mtp_model): needs PagedAttention, unavailable on CPU"),
)

CONFIGS_060: tuple[Configuration, ...] = (
    Configuration("control", None, {}, cases=("eos", "greedy-1tok"), note="0.6.0, plain sampling"),
    Configuration("draft-k3", "draft_model", {"draft": True, "gamma": 3}, "token", cases=("eos", "greedy-1tok"),
                  k=3, note="0.6.0 draft model (which_draft, speculative_gamma 3)"),
)


# ----------------------------------------------------------------------------- the model folder, the request mapping


def prepare_folder(name: str, variant: str, out: Path, *, version: str = VERSION) -> Path:
    """A copy of the checkpoint ``name`` as mistral.rs needs it (see the module docstring): a ``ByteLevel`` decoder,
    a verbatim chat template, and for ``plain`` an ordinary ``<eos>`` word with ``<stop>`` (id = vocab) as EOS."""
    src = REPO / "specdec_ref" / "assets" / "exact" / name
    shutil.copytree(src, out)
    tok = json.loads((out / "tokenizer.json").read_text())
    tok["decoder"] = dict(DECODER)
    tcfg = json.loads((out / "tokenizer_config.json").read_text())
    tcfg["chat_template"] = CHAT_TEMPLATE
    cfg = json.loads((out / "config.json").read_text())
    gen = json.loads((out / "generation_config.json").read_text())
    if variant == "plain":
        vocab = int(cfg["vocab_size"])
        tok["added_tokens"] = [a for a in tok["added_tokens"] if a["content"] != "<eos>"]
        tok["added_tokens"].append({"content": STOP, "id": vocab, "lstrip": False, "normalized": False,
                                    "rstrip": False, "single_word": False, "special": True})
        tcfg.update(eos_token=STOP, pad_token=STOP)
        for c in (cfg, gen):
            c.update(eos_token_id=vocab, pad_token_id=vocab)
    if version == OLD_VERSION and gen.get("bos_token_id") is None:
        gen["bos_token_id"] = gen["eos_token_id"]  # 0.6.0 panics without one (order1 has no BOS)
    (out / "tokenizer.json").write_text(json.dumps(tok, indent=1))
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=1))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps(gen, indent=1))
    return out


def _vocab(folder: Path) -> tuple[dict, int | None]:
    """The tokenizer's token -> id map and the id its post-processor prepends (None when it prepends nothing)."""
    tok = json.loads((Path(folder) / "tokenizer.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    for a in tok.get("added_tokens") or []:
        vocab.setdefault(a["content"], a["id"])
    pp = tok.get("post_processor") or {}
    first = (pp.get("single") or [{}])[0] if pp.get("type") == "TemplateProcessing" else {}
    bos = vocab.get(first["SpecialToken"]["id"]) if "SpecialToken" in first else None
    return vocab, bos


def prompt_text(prompt, vocab: dict, added_bos: int | None) -> str:
    """The text mistral.rs tokenizes back to ``prompt``: token names joined by spaces, without the leading id its
    tokenizer adds itself (spelled out, the completion endpoint would double it)."""
    names = {i: t for t, i in vocab.items()}
    ids = list(prompt)
    if added_bos is not None:
        if not ids or ids[0] != added_bos:
            raise ValueError(f"this tokenizer always prepends id {added_bos}: a prompt without it cannot be sent")
        ids = ids[1:]
    return " ".join(names[i] for i in ids)


def chat_kwargs(request, text: str) -> dict:
    """``ChatCompletionRequest`` fields for one :class:`Request` (streamed, per-token logprobs, every unused filter
    unset)."""
    s = request.sampling
    missing = [n for n, v in (("logit_bias", s.logit_bias), ("min_new_tokens", s.min_new_tokens),
                              ("constraint", s.constraint is not None), ("bad_words", s.bad_words)) if v]
    if missing:
        raise ValueError(f"the mistral.rs matrix has no {', '.join(missing)} case")
    if getattr(s, "top_k_ties", "all") == "lowest_ids":
        raise ValueError("mistral.rs states no top-k tie rule; a lowest-ids case cannot be expressed")
    kw = {"messages": text, "model": "default", "max_tokens": int(request.max_new_tokens), "stream": True,
          "logprobs": True}
    if s.greedy:
        kw["temperature"] = 0.0
    else:
        kw.update(temperature=float(s.temperature), top_k=int(s.top_k) if s.top_k else None,
                  top_p=float(s.top_p) if s.top_p else None, min_p=float(s.min_p) if s.min_p else None)
    kw.update(repetition_penalty=float(s.repetition_penalty) if s.repetition_penalty != 1.0 else None,
              presence_penalty=float(s.presence_penalty) if s.presence_penalty else None,
              frequency_penalty=float(s.frequency_penalty) if s.frequency_penalty else None)
    return {k: v for k, v in kw.items() if v is not None}


def split_text(text: str, vocab: dict) -> list[int]:
    """The token ids a streamed text spells (the ``ByteLevel`` decoder concatenates the tokens' own strings): longest
    token first at each offset; a text no sequence of tokens spells raises (never a silently dropped character)."""
    words = sorted(vocab, key=len, reverse=True)
    out, i = [], 0
    while i < len(text):
        w = next((w for w in words if w and text.startswith(w, i)), None)
        if w is None:
            raise RuntimeError(f"mistral.rs streamed {text!r}: no token spells {text[i:]!r}")
        out.append(vocab[w])
        i += len(w)
    return out


# ----------------------------------------------------------------------------- the session


class MistralrsSession(VariantSession):
    """One configuration on one target family: one ``Runner`` per folder variant, loaded on first use; each
    variant's requests are streamed, up to :data:`IN_FLIGHT` at a time."""

    def __init__(self, cfg: Configuration, pair, version: str):
        super().__init__()
        self.cfg, self.pair, self.version = cfg, pair, version
        self.tmp = Path(tempfile.mkdtemp(prefix="specdec-mistralrs-"))
        self.folders: dict = {}
        if cfg.speculative:  # a speculative set-up that cannot load is the configuration's load error
            self.instance("eos")

    def folder(self, name: str, variant: str) -> Path:
        if (name, variant) not in self.folders:
            self.folders[(name, variant)] = prepare_folder(name, variant, self.tmp / f"{name}-{variant}",
                                                           version=self.version)
        return self.folders[(name, variant)]

    def load(self, variant: str):
        import mistralrs as mr

        def which(name):
            return mr.Which.Plain(model_id=str(self.folder(name, variant)), arch=mr.Architecture.Mistral,
                                  dtype=mr.ModelDType.F32)

        o = self.cfg.options
        kw = {"no_paged_attn": True, "max_seqs": IN_FLIGHT}
        if o.get("mtp"):
            kw.update(mtp_model=str(self.folder(self.pair.draft.name, variant)), mtp_n_predict=o["mtp_n_predict"])
        if o.get("draft"):
            kw.update(which_draft=which(self.pair.draft.name), speculative_gamma=o["gamma"])
        return mr.Runner(which=which(self.pair.target.name), **kw)

    def generate_variant(self, runner, variant: str, requests) -> list[dict]:
        """The variant's requests as streams, up to :data:`IN_FLIGHT` at a time (the ``Runner`` takes one blocking
        call at a time; streams let its scheduler batch)."""
        import mistralrs as mr

        out: list = [None] * len(requests)
        vocab, bos = _vocab(self.folder(self.pair.target.name, variant))
        live, todo = [], list(reversed(range(len(requests))))
        # 0.6.0: a second stream in flight fails every stream ("Received none in ChatCompletionStreamer"), a
        # request asking for logprobs panics when speculating, and its stream carries text only
        old = self.version == OLD_VERSION
        while todo or live:
            while todo and len(live) < (1 if old else IN_FLIGHT):
                i = todo.pop()
                kw = chat_kwargs(requests[i], prompt_text(requests[i].prompt, vocab, bos))
                if old:
                    kw.pop("logprobs")
                live.append((i, runner.send_chat_completion_request(mr.ChatCompletionRequest(**kw)), []))
            still = []
            for i, stream, toks in live:
                try:
                    chunk = next(stream)
                except StopIteration:
                    raise RuntimeError(f"mistral.rs: request {i}'s stream ended without a finish_reason")
                c = chunk.choices[0]
                if old:  # tokens are the words of the streamed text
                    toks.extend(split_text(c.delta.content or "", vocab))
                elif c.logprobs is not None:
                    toks.append(vocab[c.logprobs.token])
                if c.finish_reason is None:
                    still.append((i, stream, toks))
                    continue
                r = requests[i]
                if c.finish_reason == "stop" and r.eos and (not toks or toks[-1] != r.eos_id):
                    toks.append(r.eos_id)  # the stream never carries the EOS that stopped it
                out[i] = {"completion_ids": toks, "finish_reason": c.finish_reason}
            live = still
        return out

    def validate(self, request) -> None:
        chat_kwargs(request, "")

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class MistralrsAdapter(EngineAdapter):
    def python(self) -> str:
        """This interpreter when it has this version of mistralrs, else the version's venv (never the other one)."""
        import importlib.metadata as md

        try:
            if md.version("mistralrs") == self.version:
                return sys.executable
        except md.PackageNotFoundError:
            pass
        py = REPO / (VENV_OLD if self.version == OLD_VERSION else VENV) / "bin" / "python"
        if not py.exists():
            raise EngineMissingError(f"mistralrs {self.version} is not importable here and there is no {py.parent.parent.name}:"
                                     f" build it with `{INSTALL}`")
        return str(py)

    def installed_version(self) -> str:
        import importlib.metadata as md

        return md.version("mistralrs")

    def open(self, cfg, family):
        from specdec_ref.exact import exact_pair

        return MistralrsSession(cfg, exact_pair(self.families[family]), self.version)

    def export(self, check: bool = True) -> list[dict]:
        """The model folders are written at load time (a copy of the checkpoint with its tokenizer and config files
        adapted); with ``check``, the engine's log-probabilities against the tables (:func:`check_logprobs`)."""
        if not check:
            return []
        return [{**r, "text": f"{r['model']:14s} {r['variant']:5s} positions {r['positions']:4d}, max |logprob - "
                 f"log_softmax(table)| {r['max_abs_diff']:.2e}"} for r in check_logprobs()]


_NOTES = ("prompts are text tokenized with special tokens: the adapter leaves out the <bos> order2's tokenizer adds "
          "itself (spelled out, it is doubled)",
          "nothing can be seeded (Runner(seed=...) raises on CPU; requests have no seed)",
          "top-k keeps exactly k (select_nth_unstable_by: no stated tie rule): the cases whose law depends on the tie "
          "rule are left out (ties, warp-1tok, warp, position-1tok, position)",
          "presence/frequency penalties before the repetition penalty: the penalty case runs alone in penalty-order",
          "a sampled special token is never streamed: EOS that stops is appended from finish_reason; EOS-as-ordinary "
          "cases run on a folder where <eos> is an ordinary word and EOS is a never-sampled <stop>")

ADAPTER = MistralrsAdapter(
    name="mistralrs", title="mistral.rs", version=VERSION, install=INSTALL, configurations=CONFIGS, k=3,
    cases=tuple(c.name for c in CASES), timeout_s=900.0, preload_modules=("mistralrs", __name__),
    conventions=Conventions(top_k_ties="unstated", first_token_at_prefill=True, seeds="none", notes=_NOTES))

#: mistral.rs 0.6.0, the last release with draft-model speculation (a second adapter instance, its own venv and
#: expectation file ``expected/mistralrs-0.6.0.json``).
ADAPTER_060 = MistralrsAdapter(
    name="mistralrs", title="mistral.rs 0.6.0", version=OLD_VERSION, install=INSTALL, configurations=CONFIGS_060,
    k=3, cases=("eos", "greedy-1tok"), timeout_s=900.0, cpu_features=("gfni",),
    preload_modules=("mistralrs", __name__),
    conventions=Conventions(top_k_ties="unstated", first_token_at_prefill=True, seeds="none", notes=_NOTES))


def check_logprobs(n: int = 24, max_tokens: int = 8) -> list[dict]:
    """The engine's reported log-probabilities against the tables: ``n`` requests per (model, prompt) at temperature
    1 with ``top_logprobs`` = the whole vocabulary (non-streamed: its ``logprobs`` hold every generated token, EOS
    included); at every generated position the eight values must be ``log_softmax`` of the table row of the context
    the engine actually sampled (KV cache and positions exercised)."""
    import mistralrs as mr
    import numpy as np

    from specdec_ref.exact import exact_model

    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="specdec-mistralrs-check-"))
    try:
        for name, variant, prompts in (("order1-target", "plain", [(2, 6), (0,)]), ("order2-target", "eos", [(6,), (6, 0)])):
            folder = prepare_folder(name, variant, tmp / f"{name}-{variant}")
            vocab, bos = _vocab(folder)
            runner = mr.Runner(which=mr.Which.Plain(model_id=str(folder), arch=mr.Architecture.Mistral,
                                                    dtype=mr.ModelDType.F32), no_paged_attn=True, max_seqs=4)
            em = exact_model(name)
            worst, positions = 0.0, 0
            for prompt in prompts:
                for _ in range(n):
                    req = mr.ChatCompletionRequest(messages=prompt_text(prompt, vocab, bos), model="default",
                                                   max_tokens=max_tokens, temperature=1.0, logprobs=True,
                                                   top_logprobs=8)
                    ctx = list(prompt)
                    for tok in runner.send_chat_completion_request(req).choices[0].logprobs.content:
                        row = np.asarray(em.next_logits([ctx]), dtype=np.float64)[0]
                        want = row - row.max() - np.log(np.exp(row - row.max()).sum())
                        got = {t.token: t.logprob for t in tok.top_logprobs}
                        if sorted(got) != list(range(8)):
                            raise RuntimeError(f"top_logprobs returned ids {sorted(got)}")
                        worst = max(worst, max(abs(got[i] - want[i]) for i in range(8) if want[i] > -50))
                        positions += 1
                        ctx.append(vocab[tok.token])
                        if name.startswith("order2") and ctx[-1] == 7:
                            break
            del runner
            rows.append({"model": name, "variant": variant, "positions": positions, "max_abs_diff": float(worst),
                         "passed": worst < 1e-5})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def penalty_order_fit(path) -> dict:
    """The ``penalty`` case's second tokens (``path``: its JSONL) against two models of the penalties, per first
    token: the reference's order (repetition, then presence) and mistral.rs's (presence, then repetition on the
    result; ``apply_freq_pres_rep_penalty``). Pearson chi-square over the cells with expected count >= 5. Both orders
    agree on the first token (nothing generated yet, no presence), which is why the case departs first at 2."""
    import numpy as np
    from scipy.stats import chi2

    from specdec_ref.exact import exact_model

    from ..matrix import case as get_case

    c = get_case("penalty")
    s, prompt = c.sampling, list(c.prompt)
    rows = np.asarray(exact_model(c.model).next_logits([[a] for a in range(8)]), dtype=np.float64)

    def law(ctx, presence_first):
        x, gen, seen = rows[ctx[-1]].copy(), set(ctx[len(prompt):]), set(ctx)
        for t in range(len(x)):
            rep = (lambda v: v / s.repetition_penalty if v > 0 else v * s.repetition_penalty) if t in seen else (lambda v: v)
            pres = s.presence_penalty if t in gen else 0.0
            x[t] = rep(x[t] - pres) if presence_first else rep(x[t]) - pres
        p = np.exp((x - x.max()) / s.temperature)
        return p / p.sum()

    counts: dict = {}
    for line in open(path):
        ids = json.loads(line)["completion_ids"]
        if len(ids) >= 2 and ids[0] != 7:
            counts.setdefault(ids[0], np.zeros(8))[ids[1]] += 1
    out = {}
    for name, first in (("reference (repetition, then presence)", False), ("mistral.rs (presence, then repetition)", True)):
        stat, df = 0.0, 0
        for g1, obs in counts.items():
            e = law(prompt + [g1], first) * obs.sum()
            keep = e >= 5
            stat += float((((obs - e) ** 2) / np.where(e > 0, e, 1))[keep].sum())
            df += int(keep.sum()) - 1
        out[name] = {"chi2": stat, "df": df, "p": float(chi2.sf(stat, df))}
    return out


def main(argv=None) -> int:
    """``python -m conformance.engines.mistralrs penalty-model PENALTY.jsonl``: the penalty case's completions under
    the reference's penalty order and under mistral.rs's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2 or argv[0] != "penalty-model":
        print("usage: python -m conformance.engines.mistralrs penalty-model PENALTY.jsonl", file=sys.stderr)
        return 2
    fits = penalty_order_fit(argv[1])
    for name, f in fits.items():
        print(f"  position 2 under {name}: chi-square {f['chi2']:.1f} on {f['df']} df, p = {f['p']:.3g}")
    return 0 if list(fits.values())[1]["p"] > 1e-6 else 1
