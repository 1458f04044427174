"""Turn a record that `harness verify --save` wrote on the device into a test record of tests/data/real_startups
(harness.verify.record.StartupRecord): the LLM class's keyword arguments from the command, the config facts of the
directory it started, and the machine from the driver's startups.jsonl header of the same call.

    python results/h200/verify-live/import_verify.py SAVED.yaml CONFIG_DIR STARTUPS.jsonl NAME OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.verify.record import Machine, dump_record, load_record

NOTES = ("the oracle install: vLLM 0.26.0's wheel with torch 2.11.0 of the image; FlashInfer and the CUTLASS DSL "
         "are not shipped (VLLM_USE_FLASHINFER_SAMPLER=0: the sampler's PyTorch path; the router's ll_bf16 GEMM off)")


def main() -> None:
    saved, config_dir, jsonl, name, out = sys.argv[1:6]
    record = load_record(Path(saved))
    header = json.loads(Path(jsonl).read_text().splitlines()[0])
    gpu, mib, driver = [x.strip() for x in header["gpu"].split(",")]
    machine = Machine(gpu_name=gpu, gpu_memory_mib=int(mib.split()[0]), driver=driver, torch=header["torch"],
                      cuda=header["cuda"], python=header["python"].split()[0], transformers=header["transformers"],
                      triton=header["triton"], notes=NOTES)
    words = record.serve[3:]
    kwargs = {words[i][2:].replace("-", "_"): int(words[i + 1]) for i in range(0, len(words), 2)}
    config = json.loads((Path(config_dir) / "config.json").read_text())
    model = Path(config_dir).name
    record = record.model_copy(update={
        "model": model, "serve": ["vllm", "serve", model, *words], "llm_kwargs": kwargs, "config": config,
        "machine": machine, "hf_model": "Qwen/Qwen3-8B",
        "key_lines": [x.replace(str(config_dir), model) for x in record.key_lines],
        "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_LOGGING_LEVEL": "DEBUG"},
        "source": "harness verify --entry llm, live on the lent H200 (results/h200/verify-live/llm-qwen3-8b-4l)"})
    text = dump_record(record, "A real vLLM 0.26.0 startup that `harness verify --entry llm` made on one H200; its "
                               "figures as vLLM printed them, the model's config facts under config:")
    (Path(out) / f"{name}.yaml").write_text(text)
    print(name, record.status)


if __name__ == "__main__":
    main()
