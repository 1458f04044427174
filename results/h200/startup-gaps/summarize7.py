"""The seventh batch's profile runs (probe.py with PROBE_PROFILE_ONLY=1), kept small: per probe the peak over the
profile's start, the allocator's counters at each boundary, and the blocks live at the peak that were made in the
profile run, grouped by their stack (an Inductor file named by its line only: its hash path is the machine's cache).

    python summarize7.py DIR NAME... > summary7.json
"""

import json
import os
import sys


def short(frame):
    path, _, rest = frame.partition(".py:")
    if "/inductor_cache/" in path:
        return "inductor:" + os.path.basename(path)[:8] + ".py:" + rest
    return frame.split("site-packages/")[-1]


out = {}
for name in sys.argv[2:]:
    with open(os.path.join(sys.argv[1], name + ".json")) as f:
        probe = json.load(f)
    analysis = probe["profile"]["analysis"]
    out[name] = {
        "kwargs": probe["kwargs"],
        "peak_over_start": analysis["peak_over_start"],
        "points": [{k: p.get(k) for k in ("tag", "allocated", "max_allocated", "tokens")}
                   for p in probe["profile"]["points"]],
        "peak_event": [short(x) for x in analysis["peak_event_frames"][:6]],
        "new_at_peak": [{"bytes": g["bytes"], "n": g["n"], "sizes": g["sizes"], "frames": [short(x) for x in g["frames"][:12]]}
                        for g in analysis["new_at_peak"]],
    }
json.dump(out, sys.stdout, indent=1)
print()
