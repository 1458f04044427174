"""The plan's figures for the fourteenth batch's startups, written before they ran: each from a committed record
(its release, machine and LLM-class settings) with the new config directory and settings in its place.

    python results/h200/real-startups/predict15.py OUT.json   (from the repository root, after gen13.py in .verify)
"""

import json
import sys
from pathlib import Path

from harness.sizing.deployment import GIB
from harness.verify.compare import torch_peak_gib
from harness.verify.logparse import llm_kwargs_to_serve
from harness.verify.planning import plan_record
from harness.verify.record import load_record

RECORDS = Path("tests/data/real_startups")
SEQS = {"max_num_seqs": 64}
NEW = [("kimi-k2-4l-heads16", "kimi-k2-4l", "kimi-k2-4l-heads16", SEQS),
       ("dsv3-4l-heads16-b16k", "dsv3-4l-heads16", "dsv3-4l-heads16", {**SEQS, "max_num_batched_tokens": 16384}),
       ("dsv3-4l-heads16-top6-i1024", "dsv3-4l-heads16", "dsv3-4l-heads16-top6-i1024", SEQS)]

out = {}
for name, base, config_dir, changed in NEW:
    record = load_record(RECORDS / f"{base}.yaml")
    config = json.loads(Path(f".verify/configs/{config_dir}/config.json").read_text())
    kwargs = {**record.llm_kwargs, **changed}
    settings = record.settings.model_copy(update=changed)
    plan = plan_record(record.model_copy(update={"config": config, "llm_kwargs": kwargs, "settings": settings,
                                                 "serve": llm_kwargs_to_serve(record.model, kwargs)}))
    peak = next(line.source for line in plan.lines if line.name == "activations")
    out[name] = {"weights_gib": round(plan.group_bytes("weights") / GIB, 3),
                 "torch_peak_gib": round(torch_peak_gib(plan), 3),
                 "cuda_graphs_gib": round(plan.group_bytes("cuda-graphs") / GIB, 3), "kv_tokens": plan.kv_tokens,
                 "other_outcomes": [{"name": o.name, "kv_tokens": o.kv_tokens,
                                     "torch_peak_extra_gib": round(o.torch_peak_extra_bytes / GIB, 3)}
                                    for o in plan.other_outcomes],
                 "peak_detail": peak}
    print(name, {k: v for k, v in out[name].items() if k != "peak_detail"})
    print("   ", peak[:420])
Path(sys.argv[1]).write_text(json.dumps(out, indent=1) + "\n")
