"""Replay of a vLLM case that departs from its exact law (standalone: vllm, numpy and the checkpoint folders).

The case's requests run against the installed vLLM; the first LENGTH generated tokens are counted and compared
with the exact law embedded in SETTINGS (from the checkpoint's tables): chi-square against the critical value at
alpha 1e-6. The runner writes a copy of this file with SETTINGS filled in (:func:`conformance.engines.vllm.adapter.
replay_script`); run that copy with the interpreter its docstring names.
"""
import collections
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

SETTINGS = {}  # filled in by the replay writer: title, target, spec, prompt, params, n, length, eos, law, critical, patches


def patch_a():
    """The fix of defect A: expand request values to their draft tokens in the output's own dtype."""
    import torch
    import vllm.utils.cpu_triton_utils as cpu_tl

    def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
        cu = cu_num_tokens.to(torch.int64)
        starts = torch.cat([cu.new_zeros(1), cu[:-1]])
        for r in range(input_val.shape[0]):
            v = input_val[r]
            v = torch.as_tensor(replace_to, dtype=input_val.dtype) if v == replace_from else v
            output[int(starts[r]):int(cu[r])] = v.to(output.dtype)

    cpu_tl._expand_kernel_impl = expand


def patch_b():
    """The fix of defect B: the top-k-only path on an empty batch."""
    import vllm.v1.sample.ops.topk_topp_sampler as tts

    original = tts.apply_top_k_only
    tts.apply_top_k_only = lambda logits, k: logits if logits.shape[0] == 0 or k.numel() == 0 else original(logits, k)


def main():
    import numpy as np

    s = SETTINGS
    for name in s["patches"]:
        {"A": patch_a, "B": patch_b}[name]()
    from vllm import LLM, SamplingParams

    llm = LLM(model=s["target"], speculative_config=s["spec"], dtype="float32", enforce_eager=True, max_model_len=32,
              seed=0, max_num_seqs=1024, max_num_batched_tokens=8192)
    n, params = s["n"], s["params"]
    requests = [SamplingParams(**dict(params, seed=(None if params.get("seed") is None else 7_000_000 + i)))
                for i in range(n)]
    outs = llm.generate([{"prompt_token_ids": s["prompt"]}] * n, requests, use_tqdm=False)
    counts = collections.Counter()
    for o in outs:
        seq = []
        for t in o.outputs[0].token_ids[: s["length"]]:
            seq.append(int(t))
            if s["eos"] is not None and t == s["eos"]:
                break
        counts[" ".join(map(str, seq))] += 1
    law = s["law"]
    keys = sorted(set(law) | set(counts))
    obs = np.array([counts[k] for k in keys], float)
    exp = np.array([law.get(k, 0.0) for k in keys]) * n
    impossible = {k: counts[k] for k in keys if law.get(k, 0.0) == 0 and counts[k]}
    big = exp >= 20
    chi = float((((obs - exp) ** 2 / np.where(exp > 0, exp, 1))[big]).sum())
    rest_o, rest_e = obs[~big].sum(), exp[~big].sum()
    if rest_e > 0:
        chi += (rest_o - rest_e) ** 2 / rest_e
    tv = 0.5 * np.abs(obs / n - exp / n).sum()
    print(s["title"])
    print(f"N={n}, chi-square {chi:.1f} (critical {s['critical']:.1f} at alpha 1e-6), TV {tv:.3f}, impossible {impossible}")
    for i in np.argsort(-np.abs(obs - exp))[:8]:
        print(f"  {keys[i]:>12}: observed {obs[i]:.0f}, expected {exp[i]:.1f}")
    print("DEPARTS from the exact law" if chi > s["critical"] or impossible else "consistent with the exact law")


if __name__ == "__main__":
    main()
