"""Qwen2.5-32B-Instruct on DAPO-17k with SvS (the paper's main setting, Table 1).

Settings: `configs.base.paper` (the SvS paper's public GRPO settings).

  python -m launch.train --config=configs/svs_dapo17k_qwen25_32b.py \\
      --config.model.path=/path/to/hf_model --config.data.train_path=/path/to/train.parquet \\
      --config.sampler.urls=http://10.0.0.2:8000,http://10.0.0.3:8000 --workdir=runs/svs_dapo17k_qwen25_32b
"""

from configs import base


def get_config():
  return base.paper("svs_dapo17k_qwen25_32b", steps=600, method="svs", integer_answers=True, fsdp=8)
