"""torch.distributed.pipelining's schedules against ``rrfp run``: :mod:`profiler.bench.external` as a script.

    .venv/bin/python benchmarks/cross_framework.py [--stages 4] [--microbatches 16] [--iters 4] ...

The comparison lives in the package (so an installed ``rrfp bench`` runs it as
``python -m profiler.bench.external``); this file keeps the command every figure in docs/benchmarks/ quotes.
"""

from profiler.bench.external import main
from profiler.bench.script_args import run

if __name__ == "__main__":
    run(main)
