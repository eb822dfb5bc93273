"""mistral.rs 0.9.5 (in ``.venv-mistralrs``, built by ``scripts/env.sh mistralrs``) on the exactly-known checkpoints,
and 0.6.0 (``.venv-mistralrs-060``).

Run by the mistral.rs stage (``.venv-mistralrs/bin/python -m pytest engine_tests/test_mistralrs.py``). A missing
engine is an error at collection (``import mistralrs``), never a skip. Checked here:

* the engine's reported log-probabilities equal ``log_softmax`` of the tables (``mistralrs.check_logprobs``);
* findings, each reproduced: the Llama loader ignores ``head_dim``; a tokenizer without a decoder is refused; the
  CPU RNG cannot be seeded; completion prompts are text only and an empty one is refused; the tokenizer's
  post-processor doubles a ``<bos>`` spelled in the prompt text, which is the ``order2`` greedy departure (the
  output leaves the table at its fifth token and equals the checkpoint's own forward on ``[6, 6, 0]``); a sampled
  special token is never streamed; ``n_choices`` > 1 returns one choice; 0.6.0 dies with SIGILL at load on a CPU
  without GFNI, and on one with GFNI returns one token more than asked and, speculating, the greedy completion for
  every request;
* top-k keeps exactly k where logits tie at the k-th place (the keep-all rule keeps more).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import mistralrs as mr  # ImportError at collection when the engine is missing: never a skip
import numpy as np
import pytest

from conformance.engines.mistralrs import adapter as ad
from conformance.engines.adapter import REPO, this_cpu_flags
from specdec_ref.exact import exact_model

VOCAB2 = {"<bos>": 6, "<eos>": 7, **{f"t{i}": i for i in range(6)}}


def _runner(folder, arch=mr.Architecture.Mistral, **kw):
    return mr.Runner(which=mr.Which.Plain(model_id=str(folder), arch=arch, dtype=mr.ModelDType.F32),
                     no_paged_attn=True, max_seqs=8, **kw)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mistralrs")
    return {(n, v): ad.prepare_folder(n, v, root / f"{n}-{v}") for n in ("order1-target", "order2-target")
            for v in ("eos", "plain") if not (n == "order2-target" and v == "plain")}


@pytest.fixture(scope="module")
def order2(folders):
    return _runner(folders[("order2-target", "eos")])


def _table_greedy(name, ctx, n):
    em, out = exact_model(name), []
    for _ in range(n):
        out.append(int(np.argmax(np.asarray(em.next_logits([list(ctx) + out]))[0])))
        if out[-1] == 7:
            break
    return out


def test_version():
    import importlib.metadata as md

    assert md.version("mistralrs") == ad.VERSION


def test_logprobs_equal_the_tables():
    rows = ad.check_logprobs(n=12)
    assert {r["model"] for r in rows} == {"order1-target", "order2-target"}
    for r in rows:
        assert r["passed"] and r["positions"] >= 30, r


def test_finding_llama_loader_ignores_head_dim(folders):
    with pytest.raises(Exception, match=r"shape mismatch for model.layers.0.self_attn.q_proj.weight"):
        _runner(folders[("order1-target", "eos")], arch=mr.Architecture.Llama)


def test_finding_tokenizer_without_decoder_is_refused(folders, tmp_path):
    import shutil

    d = tmp_path / "no-decoder"
    shutil.copytree(folders[("order1-target", "eos")], d)
    tok = json.loads((d / "tokenizer.json").read_text())
    tok["decoder"] = None  # as shipped
    (d / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(Exception, match="decoder"):
        _runner(d)
    tok["decoder"] = {"type": "WordPiece", "prefix": "##", "cleanup": False}
    (d / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(Exception, match="can't determine decoder type"):
        _runner(d)


def test_finding_the_cpu_rng_cannot_be_seeded(folders):
    """In a fresh process (the device is a process-wide once-cell: the first Runner decides it)."""
    code = ("import mistralrs as mr; mr.Runner(which=mr.Which.Plain(model_id=%r, arch=mr.Architecture.Mistral, "
            "dtype=mr.ModelDType.F32), no_paged_attn=True, seed=0)") % str(folders[("order1-target", "eos")])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "cannot seed the CPU rng with set_seed" in r.stderr, r.stderr[-500:]


def test_finding_completion_prompts_are_text_and_an_empty_one_is_refused(order2, folders):
    with pytest.raises(TypeError):
        order2.send_completion_request(mr.CompletionRequest(prompt=[6, 0], model="default", max_tokens=2))
    order1 = _runner(folders[("order1-target", "eos")])  # no post-processor: "" tokenizes to nothing
    with pytest.raises(ValueError, match="empty prompt"):
        order1.send_completion_request(mr.CompletionRequest(prompt="", model="default", max_tokens=2))
    # the chat path (with the folder's verbatim template) sends [<bos>] alone: the table's greedy from [6]
    res = order2.send_chat_completion_request(mr.ChatCompletionRequest(messages="", model="default", max_tokens=4,
                                                                       temperature=0.0, logprobs=True))
    assert res.usage.prompt_tokens == 1
    assert [VOCAB2[t.token] for t in res.choices[0].logprobs.content] == _table_greedy("order2-target", [6], 4)


def test_finding_a_bos_in_the_prompt_text_is_doubled_which_is_the_order2_departure(order2):
    """The completion endpoint tokenizes with the special tokens on: ``<bos> t0`` becomes [6, 6, 0]. The order2
    target reads the last two tokens and the parity of the position, so the second <bos> shifts every parity: the
    greedy output leaves the tables at its fifth token. Model: the checkpoint's own forward (transformers) on
    [6, 6, 0] gives the engine's output token for token. The chat path (the adapter's) sends [6, 0] either way."""
    import torch
    from transformers import AutoModelForCausalLM

    assert order2.tokenize_text("<bos> t0", True, None) == [6, 6, 0]
    assert order2.tokenize_text("t0", True, None) == [6, 0]
    n = 8
    out = {}
    for text in ("<bos> t0", "t0"):
        res = order2.send_completion_request(mr.CompletionRequest(prompt=text, model="default", max_tokens=n,
                                                                  temperature=0.0))
        out[text] = (res.usage.prompt_tokens, [VOCAB2[t] for t in re.findall(r"t\d|<eos>", res.choices[0].text)])
    table = _table_greedy("order2-target", [6, 0], n)
    assert out["t0"] == (2, table)  # sent as the tokenizer expects: the tables' greedy continuation
    assert out["<bos> t0"][0] == 3
    doubled = out["<bos> t0"][1]
    first = next(i for i, (a, b) in enumerate(zip(doubled, table)) if a != b)
    assert first == 4  # the fifth generated token: past the matrix's greedy case (4 tokens)
    hf = AutoModelForCausalLM.from_pretrained(str(REPO / "specdec_ref/assets/exact/order2-target"))
    ref = hf.generate(torch.tensor([[6, 6, 0]]), max_new_tokens=n, do_sample=False, eos_token_id=7, pad_token_id=7)
    assert ref[0, 3:].tolist()[:len(doubled)] == doubled
    chat = order2.send_chat_completion_request(mr.ChatCompletionRequest(messages="<bos> t0", model="default",
                                                                        max_tokens=2, temperature=0.0))
    assert chat.usage.prompt_tokens == 2


def test_finding_sampled_special_tokens_are_never_streamed(folders):
    """With the shipped tokenizer and ignore_eos a sampled EOS vanishes from the stream (completions shorter than
    max_tokens with finish_reason 'length'); the non-streamed logprobs show it. The plain folder streams it."""
    eos = _runner(folders[("order1-target", "eos")])
    lengths = Counter()
    for _ in range(150):
        it = eos.send_chat_completion_request(mr.ChatCompletionRequest(messages="t3 t1", model="default", max_tokens=3,
                                                                       temperature=1.0, stream=True, logprobs=True,
                                                                       ignore_eos=True))
        chunks = [c.choices[0] for c in it]
        lengths[(sum(1 for c in chunks if c.logprobs is not None), chunks[-1].finish_reason)] += 1
    assert any(n < 3 and f == "length" for n, f in lengths), lengths
    full = eos.send_chat_completion_request(mr.ChatCompletionRequest(messages="t3 t1", model="default", max_tokens=3,
                                                                     temperature=1.0, logprobs=True, ignore_eos=True))
    assert len(full.choices[0].logprobs.content) == 3
    plain = _runner(folders[("order1-target", "plain")])
    seen = Counter()
    for _ in range(150):
        it = plain.send_chat_completion_request(mr.ChatCompletionRequest(messages="t3 t1", model="default",
                                                                         max_tokens=3, temperature=1.0, stream=True,
                                                                         logprobs=True))
        toks = [c.choices[0].logprobs.token for c in it if c.choices[0].logprobs is not None]
        seen[len(toks)] += 1
        seen["eos"] += toks.count("<eos>")
    assert seen[3] == 150 and seen["eos"] > 0


def test_finding_n_choices_returns_one_choice(folders):
    r = _runner(folders[("order1-target", "eos")])
    res = r.send_completion_request(mr.CompletionRequest(prompt="t3 t1", model="default", max_tokens=2,
                                                         temperature=1.0, n_choices=50))
    assert len(res.choices) == 1


def test_top_k_keeps_exactly_k_through_a_tie(folders):
    """Row 5 of order1-target (logits 4, 1.5, 1.5 at ids 0, 3, 6) at top-k 2: the keep-all rule keeps three tokens,
    mistral.rs two (on these 8-token rows its selection happens to keep the lower id)."""
    r = _runner(folders[("order1-target", "plain")])
    got = Counter()
    for _ in range(400):
        res = r.send_chat_completion_request(mr.ChatCompletionRequest(messages="t5", model="default", max_tokens=1,
                                                                      temperature=3.0, top_k=2, logprobs=True))
        got[res.choices[0].logprobs.content[0].token] += 1
    assert set(got) == {"t0", "t3"}, got


_PROBE_060 = r"""
import json, sys
import mistralrs as mr
target, draft, mode = sys.argv[1:4]
def which(p):
    return mr.Which.Plain(model_id=p, arch=mr.Architecture.Mistral, dtype=mr.ModelDType.F32)
def ask(runner, temperature, max_tokens=4):
    res = runner.send_chat_completion_request(mr.ChatCompletionRequest(
        messages="t2 t6", model="default", max_tokens=max_tokens, temperature=temperature))
    c = res.choices[0]
    return [c.message.content, c.finish_reason, res.usage.completion_tokens]
if mode == "plain":
    runner = mr.Runner(which=which(target), no_paged_attn=True)
    print("loaded", flush=True)
    out = [ask(runner, 1.0) for _ in range(40)]
else:
    runner = mr.Runner(which=which(target), no_paged_attn=True, which_draft=which(draft), speculative_gamma=3)
    print("loaded", flush=True)
    out = {"sampled": [ask(runner, t) for t in (1.0, 2.0) for _ in range(20)], "greedy": ask(runner, 0.0)}
print(json.dumps(out))
"""


def test_finding_060_on_this_cpu(folders, tmp_path):
    """0.6.0, as this CPU lets it run. Without GFNI: its wheel executes ``vgf2p8affineqb`` (GFNI) in llguidance's
    ``derivre`` while building its grammar factory at load, without checking the CPU, and the process dies with
    SIGILL. With GFNI it loads, and shows the two bugs filed against it: (1) every mode returns one token more than
    ``max_tokens`` when no EOS stops it; (2) with draft-model speculation every request gets the same completion at any
    temperature, the greedy one (its speculative sampler takes an argmax; see docs/mistralrs-verdict.md)."""
    py = REPO / ad.VENV_OLD / "bin" / "python"
    assert py.exists(), f"{py} missing: run scripts/env.sh mistralrs"
    target = ad.prepare_folder("order1-target", "eos", tmp_path / "t", version=ad.OLD_VERSION)
    draft = ad.prepare_folder("order1-draft-close", "eos", tmp_path / "d", version=ad.OLD_VERSION)
    def probe(mode):  # one process each: a speculative Runner made after a plain one panics (SendError)
        return subprocess.run([str(py), "-c", _PROBE_060, str(target), str(draft), mode], capture_output=True,
                              text=True, timeout=600)

    r = probe("plain")
    if "gfni" not in this_cpu_flags():
        assert r.returncode == -4, (r.returncode, r.stdout[-300:], r.stderr[-300:])  # SIGILL
        assert re.search(r"loaded", r.stdout) is None
        return
    runs = {}
    for mode, res in (("plain", r), ("speculative", probe("speculative"))):
        assert res.returncode == 0, (mode, res.returncode, res.stdout[-300:], res.stderr[-600:])
        runs[mode] = json.loads(res.stdout.strip().splitlines()[-1])
    vocab = ad._vocab(target)[0]
    lengths = [(len(ad.split_text(text, vocab)), reason, n) for text, reason, n in runs["plain"]]
    over = [x for x in lengths if x[1] == "length"]
    assert over and all(x[0] == x[2] == 5 for x in over), lengths  # max_tokens 4, five tokens, finish "length"
    completions = {tuple(c) for c in runs["speculative"]["sampled"]}
    greedy = runs["speculative"]["greedy"]
    assert completions == {tuple(greedy)}, (completions, greedy)  # 40 requests at temperatures 1 and 2: one
    assert ad.split_text(greedy[0], vocab) == _table_greedy("order1-target", [2, 6], 5), greedy


def test_finding_one_call_at_a_time_per_runner(folders):
    """A second thread calling the same Runner while a request is in flight gets ``RuntimeError: Already borrowed``
    (the adapter keeps one thread and overlaps requests as streams)."""
    from concurrent.futures import ThreadPoolExecutor

    r = _runner(folders[("order1-target", "eos")])

    def call(_):
        try:
            r.send_chat_completion_request(mr.ChatCompletionRequest(messages="t3 t1", model="default", max_tokens=8,
                                                                    temperature=1.0, ignore_eos=True))
            return None
        except RuntimeError as exc:
            return str(exc)

    with ThreadPoolExecutor(4) as pool:
        errors = [e for e in pool.map(call, range(80)) if e]
    assert errors and all("Already borrowed" in e for e in errors)
