"""The vLLM engines of one exactly-known checkpoint, one per logprobs mode, created on first use and shut down together
(shared by the vLLM engine tests; imported only in the vLLM venv)."""

from __future__ import annotations

import gc

from vllm import LLM

from specdec_ref.exact import ExactModel


class Engines:
    """``Engines(model, dtype, max_model_len=...)``; ``engines(mode)`` is the ``vllm.LLM`` for ``logprobs_mode=mode``
    (eager, seed 0), ``close()`` shuts every one down."""

    def __init__(self, model: ExactModel, dtype: str, *, max_model_len: int, max_num_seqs: int = 16):
        self.model, self.dtype, self._llms = model, dtype, {}
        self.max_model_len, self.max_num_seqs = max_model_len, max_num_seqs

    def __call__(self, mode: str = "raw_logprobs") -> LLM:
        if mode not in self._llms:
            self._llms[mode] = LLM(model=str(self.model.path), dtype=self.dtype, max_model_len=self.max_model_len,
                                   enforce_eager=True, max_num_seqs=self.max_num_seqs, seed=0, logprobs_mode=mode)
        return self._llms[mode]

    def close(self) -> None:
        for llm in self._llms.values():
            llm.llm_engine.engine_core.shutdown()
        self._llms.clear()
        gc.collect()
