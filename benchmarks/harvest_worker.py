"""``torchrun ... -m beliefscope.benchmarks.harvest_worker``: run ``probes.harvest.main`` with the argument list
in the environment variable ``BENCH_HARVEST_ARGV`` (a JSON list).

torchrun parses every option on its command line, even those after ``-m module``, and rejects
``--n`` as an ambiguous prefix of its own options (``--nnodes``, ``--nproc-per-node``, ...), so
``torchrun -m beliefscope.probes.harvest --n 400`` fails; passing the arguments through the environment
avoids the clash.
"""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__":
    from ..probes.harvest import main

    sys.exit(main(json.loads(os.environ["BENCH_HARVEST_ARGV"])))
