"""Qwen3-30B-A3B-Base (mixture of experts: 128 experts, 8 per token, 3.3B of 30.5B
parameters active) on MATH-12k, plain GRPO as Composition-RL ran its baseline.

The settings of configs/rlvr_math12k_qwen3_4b.py (lr 1e-6, G 8, 256 prompts, dynamic
sampling, 16K responses, avg@32 at temperature 0.6) on 16 devices (two 8 x H100 nodes),
every weight split 16-way over fsdp: 58.8 GiB per device for the update as compiled. On
8 devices the f32 master weights, AdamW moments and gradients alone take 56.9 GiB per
device and the update needs 94.4 GiB (docs/moe.md#memory). The composed runs on the same
model: configs/composition_math12k_qwen3_30b_a3b.py.

  python -m launch.train --config=configs/rlvr_math12k_qwen3_30b_a3b.py \\
      --config.model.path=/path/to/Qwen3-30B-A3B-Base \\
      --config.data.train_path=/path/to/math12k.parquet \\
      --config.sampler.urls=http://10.0.0.2:8000 --workdir=runs/rlvr_math12k_qwen3_30b_a3b
"""

from configs import base, rlvr_math12k_qwen3_4b


def get_config():
  # fsdp 16 (tensor 1): parameters, AdamW moments and gradients split over all 16 devices.
  c = base.paper("rlvr_math12k_qwen3_30b_a3b", steps=300, fsdp=16)
  return rlvr_math12k_qwen3_4b.composition_rl(c)
