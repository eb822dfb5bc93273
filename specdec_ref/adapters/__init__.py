"""Adapters that put other libraries' speculative-decoding pieces behind the backend contract:
Hugging Face transformers (:mod:`.hf_backends`) and SGLang's tree verification (:mod:`.sglang`, on the kernel
ports of :mod:`.sglang_kernels`)."""
