"""Qwen2.5-7B on MATH-12k, plain GRPO with LoRA, on ONE 80 GB GPU.

`configs.base.paper`'s GRPO settings (256 prompts x 8, prompt 4096 / response 8192
tokens, packed rows of 12,288 tokens, one per micro-batch) with `configs.base.lora` (rank 32 on
every projection, lr 1e-5). Full fine-tuning of this model does not fit one device (f32
master weights and AdamW moments alone are 85 GiB). With LoRA the frozen bf16 base is 14.2
GiB, the adapters' state under 1 GiB and the update 25.0 GiB in all (`python bench/plan.py
--config=configs/rlvr_math12k_lora_qwen25_7b.py --devices=1`; docs/scale.md).

  python -m launch.serve_vllm --model=/path/to/Qwen2.5-7B --device=gpu \\
      --config=configs/rlvr_math12k_lora_qwen25_7b.py   # LoRA's rank and lengths from it
  python -m launch.train --config=configs/rlvr_math12k_lora_qwen25_7b.py \\
      --config.model.path=/path/to/Qwen2.5-7B \\
      --config.data.train_path=/path/to/math12k.parquet \\
      --config.sampler.urls=http://localhost:8000
"""

from configs import base


def get_config():
  return base.lora(base.paper("rlvr_math12k_lora_qwen25_7b", steps=300, fsdp=1))
