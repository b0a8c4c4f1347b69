"""Qwen3-4B on MATH-12k, plain GRPO with the SvS paper's settings.

GRPO: lr 1e-6 constant, weight decay 0.01, 256 prompts x 8 responses per step
(one optimizer step per rollout batch), clip 0.2 / 0.28, dual-clip 3,
token-mean loss, no KL, grad clip 1.0, temperature 1.0, prompt 4096 /
response 8192 tokens (METHODS.md).

  python -m launch.train --config=configs/rlvr_math12k_qwen3_4b.py \\
      --config.model.path=/path/to/hf_model --config.data.train_path=/path/to/train.parquet \\
      --config.sampler.urls=http://10.0.0.2:8000,http://10.0.0.3:8000 --workdir=runs/rlvr_math12k_qwen3_4b
"""

from configs import base


def get_config():
  return base.paper("rlvr_math12k_qwen3_4b", steps=300)
