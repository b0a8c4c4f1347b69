"""Qwen3-30B-A3B-Base on MATH-12k, GRPO with LoRA, on one 8 x 80 GB node, 16K responses.

configs/rlvr_math12k_qwen3_30b_a3b.py's settings (Composition-RL's GRPO: 256 prompts x 8,
16K responses, avg@32) with `configs.base.lora`: rank-32 adapters on the attention projections
of every layer (the experts are not adapted), lr 1e-5, the bf16 base split 8-way over fsdp
(`python bench/plan.py --config=configs/rlvr_math12k_lora_qwen3_30b_a3b.py --devices=8`;
docs/scale.md).

  python -m launch.train --config=configs/rlvr_math12k_lora_qwen3_30b_a3b.py \\
      --config.model.path=/path/to/Qwen3-30B-A3B-Base \\
      --config.data.train_path=/path/to/math12k.parquet \\
      --config.sampler.urls=http://10.0.0.2:8000
"""

from configs import base, rlvr_math12k_qwen3_4b


def get_config():
  c = base.paper("rlvr_math12k_lora_qwen3_30b_a3b", steps=300, fsdp=8)
  c = base.lora(rlvr_math12k_qwen3_4b.composition_rl(c))
  c.rl.learner.lora.targets = ("q_kernel", "k_kernel", "v_kernel", "o_kernel")  # every layer
  # is sparse: its MLP is the experts
  return c
