"""Qwen3-30B-A3B-Base (mixture of experts: 128 experts, 8 per token, 3.3B of 30.5B
parameters active) on MATH-12k, plain GRPO as Composition-RL ran its baseline.

The settings of configs/rlvr_math12k_qwen3_4b.py (lr 1e-6, G 8, 256 prompts, dynamic
sampling, 16K responses, avg@32 at temperature 0.6) on one 8 x H100 node, every weight
split 8-way over fsdp. The f32 master weights and AdamW moments take 42.7 GiB per device
and the gradient accumulator 14.2 more, which leaves room for one micro-batch only because
its gradient is added into the accumulator layer by layer inside the backward pass
(rl.learner.accumulate_in_backward, set for every paper config): 72.4 GiB per device for
the update as compiled (docs/moe.md#memory). The composed runs on the same model:
configs/composition_math12k_qwen3_30b_a3b.py.

  python -m launch.train --config=configs/rlvr_math12k_qwen3_30b_a3b.py \\
      --config.model.path=/path/to/Qwen3-30B-A3B-Base \\
      --config.data.train_path=/path/to/math12k.parquet \\
      --config.sampler.urls=http://10.0.0.2:8000 --workdir=runs/rlvr_math12k_qwen3_30b_a3b
"""

from configs import base, rlvr_math12k_qwen3_4b


def get_config():
  # fsdp 8 (tensor 1): parameters, AdamW moments and gradients split over all 8 devices.
  c = base.paper("rlvr_math12k_qwen3_30b_a3b", steps=300, fsdp=8)
  return rlvr_math12k_qwen3_4b.composition_rl(c)
