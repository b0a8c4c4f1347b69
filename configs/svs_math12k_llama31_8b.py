"""Llama-3.1-8B-Instruct on MATH-12k with SvS (SvS Table 2).

Settings: `configs.base.paper` (the SvS paper's public GRPO settings).

  python -m launch.train --config=configs/svs_math12k_llama31_8b.py \\
      --config.model.path=/path/to/hf_model --config.data.train_path=/path/to/train.parquet \\
      --config.sampler.urls=http://10.0.0.2:8000,http://10.0.0.3:8000 --workdir=runs/svs_math12k_llama31_8b
"""

from configs import base


def get_config():
  return base.paper("svs_math12k_llama31_8b", steps=300, method="svs")
