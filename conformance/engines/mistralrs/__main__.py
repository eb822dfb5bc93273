"""``python -m conformance.engines.mistralrs penalty-model PENALTY.jsonl`` (:func:`.adapter.main`)."""
import sys

from .adapter import main

sys.exit(main())
