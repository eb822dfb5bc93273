"""``python -m conformance.engines.vllm ...``: the older spelling of ``python -m conformance.engines vllm ...``."""
import sys

from ..runner import main

sys.exit(main(["vllm", *sys.argv[1:]]))
