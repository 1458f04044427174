"""Turn the device driver's startups.jsonl (drive.py: one JSON line per startup, with the log's matching lines and
its tail) into tests/data/real_startups/NAME.yaml records (harness.verify.record.StartupRecord).

    python results/h200/real-startups/import_records.py CONFIGS_DIR OUT_DIR startups.jsonl [...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.verify.logparse import llm_kwargs_to_serve, parse_log
from harness.verify.record import Machine, StartupRecord, StartupSettings, dump_record

NOTES = ("the oracle install: vLLM 0.26.0's wheel with torch 2.11.0 of the image; FlashInfer and the CUTLASS DSL "
         "are not shipped (VLLM_USE_FLASHINFER_SAMPLER=0: the sampler's PyTorch path; the router's ll_bf16 GEMM off)")


# The public config.json each config directory was made from (its layers cut down where the name says so).
HF = {"qwen3-moe": "Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B", "llama-8b": "meta-llama/Llama-3.1-8B-Instruct",
      "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct", "mixtral": "mistralai/Mixtral-8x7B-Instruct-v0.1",
      "dsv2-lite": "deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-v2-lite": "deepseek-ai/DeepSeek-V2-Lite-Chat",
      "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct", "qwen3-8b": "Qwen/Qwen3-8B", "qwen1.5-moe": "Qwen/Qwen1.5-MoE-A2.7B",
      "gpt-oss": "openai/gpt-oss-20b", "dsv32": "deepseek-ai/DeepSeek-V3.2-Exp",
      "dsv3-": "deepseek-ai/DeepSeek-V3", "kimi-k2": "moonshotai/Kimi-K2-Instruct"}
# Configs made from the presets (harness/defaults/models, gen2.py): the preset's own hub id.
PRESET = {"gemma2-9b": "gemma-2-9b-it", "granite-8b": "granite-3.1-8b", "phi4": "phi-4", "phi2": "phi-2",
          "mistral-7b": "mistral-7b-v0.3", "glm45": "glm-4.5", "minimax-m2": "minimax-m2",
          "qwen3-next": "qwen3-next-80b-a3b", "llama4-scout": "llama-4-scout", "gemma3-4b": "gemma-3-4b-it"}
PRESETS = Path(__file__).resolve().parents[3] / "harness" / "defaults" / "models"
for _prefix, _preset in PRESET.items():
    HF[_prefix] = json.loads((PRESETS / f"{_preset}.json").read_text())["_hf_id"]


def main() -> None:
    configs, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    machine = None
    for name in sys.argv[3:]:
        for line in Path(name).read_text().splitlines():
            row = json.loads(line)
            if row["name"] == "_machine":
                gpu, mib, driver = [x.strip() for x in row["gpu"].split(",")]
                machine = Machine(gpu_name=gpu, gpu_memory_mib=int(mib.split()[0]), driver=driver, torch=row["torch"],
                                  cuda=row["cuda"], python=row["python"].split()[0],
                                  transformers=row["transformers"], triton=row["triton"], notes=NOTES)
                date = row["date"]
                continue
            spec = row["spec"]
            parsed = parse_log("\n".join(row["lines"] + row["tail"]))
            config = json.loads((configs / spec["config"] / "config.json").read_text())
            kwargs = spec.get("kwargs", {})
            serve = llm_kwargs_to_serve(spec["config"], kwargs) if spec["entry"] == "llm" else \
                ["vllm", "serve", spec["config"], *spec["args"]]
            comp = kwargs.get("compilation_config")
            settings = StartupSettings(
                max_num_batched_tokens=kwargs.get("max_num_batched_tokens"), max_num_seqs=kwargs.get("max_num_seqs"),
                cudagraph_memory_estimate=True, gpu_memory_utilization=kwargs.get("gpu_memory_utilization"),
                block_size=kwargs.get("block_size"), dtype=kwargs.get("dtype"),
                quantization=kwargs.get("quantization"),
                compilation=json.dumps(comp, separators=(",", ":")) if comp else None)
            status = row["status"] if not (row["status"] == "timeout" and parsed.ready) else "timeout"
            note = None
            if row["status"] == "timeout" and parsed.ready:
                note = ("the driver's deadline for the call ended it after every figure was printed (graph capture "
                        "finished); LLM() had not returned")
            hf = next(v for k, v in HF.items() if spec["config"].startswith(k))
            key_lines = [x.replace(str(configs.resolve()) + "/", "").replace("/work/main/.verify/configs/", "")
                         for x in parsed.key_lines]
            record = StartupRecord(
                schema_version=2, source="real vLLM on dummy weights (load_format=dummy, skip_tokenizer_init) on the "
                "lent H200, a config directory holding only config.json (results/h200/real-startups)",
                vllm_version="0.26.0", gpu="H200-141GB", model=spec["config"], hf_model=hf, serve=serve, settings=settings,
                figures=parsed.figures, entry=spec["entry"], llm_kwargs=kwargs if spec["entry"] == "llm" else None,
                env={"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_LOGGING_LEVEL": "DEBUG"},
                model_runner=parsed.model_runner, backends=parsed.backends,  # type: ignore[arg-type]
                key_lines=key_lines, machine=machine, date=date, startup_s=row["wall_s"], config=config,
                status=status, error=parsed.error, note=note)
            header = (f"A real vLLM {record.vllm_version} startup on one H200 ({record.entry} entry); its figures as "
                      "vLLM printed them, the model's config facts under config:")
            (out / f"{row['name']}.yaml").write_text(dump_record(record, header))
            print(row["name"], status)


if __name__ == "__main__":
    main()
