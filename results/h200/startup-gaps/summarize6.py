"""Summarises the sixth batch's allocator histories (NAME.events.json.gz from probe.py with PROBE_EVENTS=1) into
summary6.json: per probe and capture, the segments each sample made (with the request that opened each), and for
each FULL capture the first layer's small-pool requests on the capture stream with the segment and offset each got.

    python3 summarize6.py DIR NAME... > summary6.json
"""

import gzip
import json
import sys

MIB = 1 << 20


def load(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


def short(frames):
    return frames[0].split("/")[-1] if frames else "?"


def summarize(d):
    pts, ev = d["points"], d["events"]
    ts = [p["t_us"] for p in pts]

    def interval(t):
        k = max((i for i in range(len(ts)) if ts[i] <= t), default=-1)
        p = pts[k] if k >= 0 else {"tag": "before"}
        return p["tag"], p.get("tokens"), p.get("mode")

    out = {"samples": [], "full_first_layer": {}, "piecewise_first_layer": {}}
    # the capture stream's 2 MiB segments the graph pool uses, in the order they were made (the one capture_begin's
    # 8-byte requests open belongs to the default pool and is left out)
    seg_order, default_pool = [], set()
    for e in ev:
        if e[0] == "segment_alloc" and e[2] == 2 * MIB:
            seg_order.append(e[1])
        elif e[0] == "alloc" and "capture_begin" in short(e[5]):
            default_pool |= {s for s in seg_order if s <= e[1] < s + 2 * MIB}
    seg_order = [s for s in seg_order if s not in default_pool]  # capture_begin's is the default pool's
    stream_of = {e[1]: e[3] for e in ev if e[0] == "segment_alloc"}
    main = next(e[3] for e in ev if e[0] == "alloc" and "capture_begin" in short(e[5]))
    seg_order = [s for s in seg_order if stream_of[s] == main]  # the capture stream's, not the aux stream's
    for k, p in enumerate(pts[:-1]):
        if p["tag"] != "_warmup_and_capture>":
            continue
        end = next(j for j in range(k + 1, len(pts)) if pts[j]["tag"] == "_warmup_and_capture<")
        made = []
        for i, e in enumerate(ev):
            if ts[k] <= e[4] < ts[end] and e[0] == "segment_alloc":
                nxt = next((x for x in ev[i + 1:i + 4] if x[0] == "alloc"), None)
                made.append({"segment_MiB": e[2] / MIB, "stream": e[3], "run": interval(e[4])[2],
                             "request": nxt[2] if nxt else None, "by": short(nxt[5]) if nxt else None})
        mode = next((q.get("mode") for q in pts[k + 1:end] if q.get("mode") not in (None, "NONE")), None)
        out["samples"].append({"mode": mode, "tokens": p.get("tokens"),
                               "free_drop_MiB": (p["free"] - pts[end]["free"]) / MIB,
                               "reserved_delta_MiB": (pts[end]["reserved"] - p["reserved"]) / MIB,
                               "segments_made": made})
    # FULL captures: the first layer's small requests on the capture stream, through its attention
    for k, p in enumerate(pts[:-1]):
        if not (p["tag"] == "_dummy_run>" and p.get("mode") in ("FULL", "PIECEWISE")):
            continue
        n = p["tokens"]
        lo, hi = ts[k], ts[k + 1]
        stream = None
        seq, live, seen_first = [], {}, 0
        for e in ev:
            if not lo <= e[4] < hi or e[0] not in ("alloc", "free_completed"):
                continue
            a, addr, size, st, _, fr = e
            f = short(fr)
            seg = next((s for s in seg_order if s <= addr < s + 2 * MIB), None)
            if seg is None or st != stream_of.get(seg, st):
                continue
            if a == "alloc" and size == n * 56 * 4 and ".py:" in f and f.startswith("c"):
                seen_first += 1
                if seen_first == 2:
                    break
            if a == "alloc":
                live[addr] = size
                seq.append(["alloc", size, seg_order.index(seg), addr - seg, f])
            elif addr in live:
                live.pop(addr)
                seq.append(["free", size, seg_order.index(seg), addr - seg, f])
        out["full_first_layer" if p["mode"] == "FULL" else "piecewise_first_layer"][str(n)] = seq
    # the graph pool's small segments numbered in the order the FULL captures first use them
    order = []
    seqs = [*out["piecewise_first_layer"].values(), *out["full_first_layer"].values()]
    for seq in seqs:
        for row in seq:
            if row[2] not in order:
                order.append(row[2])
    for seq in seqs:
        for row in seq:
            row[2] = order.index(row[2])
    return out


if __name__ == "__main__":
    base, names = sys.argv[1], sys.argv[2:]
    json.dump({n: summarize(load(f"{base}/{n}.events.json.gz")) for n in names}, sys.stdout, indent=1)
    print()
