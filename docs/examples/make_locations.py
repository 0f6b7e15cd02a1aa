"""Write `tasks/data/locations.jsonl` (shipped: `beliefscope.tasks.records.example_path("locations.jsonl")`):
200 short stories of an object moving between rooms, for `beliefscope harvest --data`.

The stories come from `beliefscope.tasks.locations.location_records` (its docstring gives the fields).
Run ``python docs/examples/make_locations.py`` to rebuild the file; the seed is fixed, so it is
byte-identical. ``python docs/examples/make_locations.py OUT.jsonl 400`` writes a larger set.
"""

import json
import os
import sys

from beliefscope.tasks.locations import location_records


def main(path: str | None = None, n: int = 200) -> str:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = path or os.path.join(root, "tasks", "data", "locations.jsonl")
    with open(path + ".tmp", "w") as f:
        for rec in location_records(n):
            f.write(json.dumps(rec) + "\n")
    os.replace(path + ".tmp", path)
    return path


if __name__ == "__main__":
    print(main(*(sys.argv[1:2] or [None]), *[int(a) for a in sys.argv[2:3]]))
