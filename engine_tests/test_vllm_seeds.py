"""vLLM defect D, reproduced: with ``draft_sample_method="probabilistic"`` a request's ``seed`` no longer fixes its
output; with argmax drafts it does, and with ``conformance.engines.vllm.patch``'s fix D it does again.

Run in the vLLM stage only (``.venv-vllm/bin/python -m pytest engine_tests/test_vllm_seeds.py``). 32 seeded requests
(temperature 0.8, the prompt ``[2, 5]``, 8 tokens) are generated twice in the same engine, and a third time in reverse
order beside 32 unseeded requests. Mechanism: ``compute_probs_and_sample_next_token``
(``vllm/v1/spec_decode/llm_base_proposer.py``) draws the drafts' exponential noise with ``q.exponential_()`` from the
global generator ("TODO(woosuk): Consider seeds."), while the rejection sampler draws the request's own uniforms; the
emitted tokens depend on the drafts through the verifier's coupling, so they depend on the global generator's state.
The law stays exact (the ``eagle-prob`` and ``draft-prob`` configurations are CERTIFIED with defects A and C
patched); the engine runner's seed probe (``conformance.engines.seeds``) names it in the matrix. Fix D draws the seeded
rows' noise from the request's generator (as vLLM's own ``random_sample`` does for the target's tokens).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.xdist_group("vllm_seeds")

#: Run in a process of its own: the patches of defects A and C (the rejection sampler's own, so that only the drafts'
#: generator is left), and D where asked, must not reach the other engine tests' processes.
_SCRIPT = r"""
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from conformance.engines.vllm.patch import apply
apply(*sys.argv[3].split(","))
from vllm import LLM, SamplingParams
from conformance.engines.vllm.adapter import ENGINE_ARGS
from specdec_ref.exact.head_files import head_folder
from specdec_ref.exact.registry import exact_pair

method, root = sys.argv[1], sys.argv[2]
pair = exact_pair("order1-close")
folder = head_folder("eagle", pair.target.name, heads=3, root=__import__("pathlib").Path(root))
llm = LLM(model=str(pair.target.path), speculative_config={
    "method": "eagle", "model": str(folder), "num_speculative_tokens": 3, "draft_sample_method": method},
    **ENGINE_ARGS)
seeds = list(range(1000, 1032))


def run(seeds, fillers=0):
    params = [SamplingParams(n=1, max_tokens=8, seed=s, temperature=0.8, top_k=0, top_p=1.0, min_p=0.0,
                             ignore_eos=True, detokenize=False) for s in seeds]
    params += [SamplingParams(n=1, max_tokens=8, temperature=0.8, ignore_eos=True, detokenize=False)] * fillers
    outs = llm.generate([{"prompt_token_ids": [2, 5]}] * len(params), params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs[: len(seeds)]]


first = run(seeds)
again = run(seeds)
other = run(seeds[::-1], fillers=32)[::-1]
print("RESULT " + json.dumps({"again": sum(a != b for a, b in zip(first, again)),
                              "other_batch": sum(a != c for a, c in zip(first, other)), "n": len(seeds)}))
"""


@pytest.mark.parametrize("method,patches", [("greedy", "A,C"), ("probabilistic", "A,C"), ("probabilistic", "A,C,D")],
                         ids=["argmax-drafts", "sampled-drafts", "sampled-drafts-fix-D"])
def test_a_seed_fixes_the_output_only_with_argmax_drafts_or_fix_d(method, patches, tmp_path):
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, method, str(tmp_path), patches], capture_output=True,
                          text=True, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, f"the reproduction failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    r = json.loads(line[len("RESULT "):])
    if method == "greedy" or "D" in patches:
        assert r["again"] == r["other_batch"] == 0, f"{method} drafts, patches {patches}: seeded completions changed: {r}"
    else:  # defect D: most of them change (59 to 61 of 64 in the first measurement, 8 tokens at T 0.8)
        assert r["again"] + r["other_batch"] >= 16, f"probabilistic drafts: few seeded completions changed (fixed?): {r}"
