"""Write the shipped story datasets for `beliefscope harvest --data` (`beliefscope.tasks.records.example_path`):

- `tasks/data/locations.jsonl`: 200 short stories of an object moving between rooms
  (`beliefscope.tasks.locations.location_records`);
- `tasks/data/tracking.jsonl`: 200 entity-tracking stories, five objects in five boxes, then moves, with the
  watched object's box after every sentence and each record's own question
  (`beliefscope.tasks.boxes_tracking.tracking_records`).

Their docstrings give the fields. Run ``python docs/examples/make_locations.py`` to rebuild both files; the
seeds are fixed, so they are byte-identical. ``python docs/examples/make_locations.py OUT_DIR 400`` writes
larger sets into OUT_DIR.
"""

import json
import os
import sys

from beliefscope.base.files import atomic_write_text
from beliefscope.tasks.boxes_tracking import tracking_records
from beliefscope.tasks.locations import location_records

SETS = {"locations.jsonl": location_records, "tracking.jsonl": tracking_records}


def main(folder: str | None = None, n: int = 200) -> list[str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    folder = folder or os.path.join(root, "tasks", "data")
    paths = []
    for name, records in SETS.items():
        paths.append(os.path.join(folder, name))
        atomic_write_text(paths[-1], "".join(json.dumps(rec) + "\n" for rec in records(n)))
    return paths


if __name__ == "__main__":
    print("\n".join(main(*(sys.argv[1:2] or [None]), *[int(a) for a in sys.argv[2:3]])))
