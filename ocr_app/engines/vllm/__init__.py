"""The vllm engine (engine.py): LightOnOCR-2-1B through vLLM's AsyncLLM on a GPU; its answers read and judged
(output.py), its lines boxed by grounding (grounding.py), its GPU seen through NVML (device.py), vLLM itself
imported, built and measured (runtime.py)."""
