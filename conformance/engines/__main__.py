"""``python -m conformance.engines ENGINE --out DIR [...]``: the shared runner (:mod:`conformance.engines.runner`);
``python -m conformance.engines export ENGINE``: the engine's checkpoints and their check (:mod:`.export`)."""
import sys

if sys.argv[1:2] == ["export"]:
    from .export import main as export_main

    sys.exit(export_main(sys.argv[2:]))
from .runner import main

sys.exit(main())
