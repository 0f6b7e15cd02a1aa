"""Write `tasks/data/tracking.jsonl` (shipped: `beliefscope.tasks.records.example_path("tracking.jsonl")`):
200 entity-tracking stories (five objects in five boxes, then moves; the watched object's box after every
sentence, and each record's own question), for `beliefscope harvest --data`.

The stories come from `beliefscope.tasks.boxes_tracking.tracking_records` (its docstring gives the fields).
Run ``python docs/examples/make_tracking.py`` to rebuild the file; the seed is fixed, so it is byte-identical.
"""

import json
import os
import sys

from beliefscope.tasks.boxes_tracking import tracking_records


def main(path: str | None = None, n: int = 200) -> str:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = path or os.path.join(root, "tasks", "data", "tracking.jsonl")
    with open(path + ".tmp", "w") as f:
        for rec in tracking_records(n):
            f.write(json.dumps(rec) + "\n")
    os.replace(path + ".tmp", path)
    return path


if __name__ == "__main__":
    print(main(*(sys.argv[1:2] or [None]), *[int(a) for a in sys.argv[2:3]]))
