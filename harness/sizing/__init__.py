"""What a scenario costs per GPU, without running it: the plan, and sizing read from vLLM releases.

Owns: `plan` (per-policy workspace shapes and bytes for a scenario) and `vllm_source` (locating a release, wheel,
tree or install; reading each batched-experts class's `workspace_shapes` without importing vLLM).

May import: harness.core, harness.scenario.
"""
