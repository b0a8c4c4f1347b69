"""Qwen2.5-32B-Instruct on MATH-12k, plain GRPO (the SvS paper's RLVR baseline, Table 1).

Settings: `configs.base.paper` (the SvS paper's public GRPO settings).

  python -m launch.train --config=configs/rlvr_math12k_qwen25_32b.py \\
      --config.model.path=/path/to/Qwen2.5-32B-Instruct --config.data.train_path=/path/to/train.parquet \\
      --config.sampler.urls=http://10.0.0.2:8000,http://10.0.0.3:8000 --workdir=runs/rlvr_math12k_qwen25_32b
"""

from configs import base


def get_config():
  return base.paper("rlvr_math12k_qwen25_32b", steps=300, fsdp=8)
