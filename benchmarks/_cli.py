"""What the benchmark scripts share on the command line (:mod:`profiler.bench.script_args`).

The scripts run as ``python benchmarks/NAME.py``, so this folder is on ``sys.path`` and they import it as
``_cli``; the parser and the progress log live in the package, where ``rrfp bench``'s external runner uses
them too.
"""

from profiler.bench.script_args import Parser, progress, run

__all__ = ["Parser", "progress", "run"]
