"""Qwen2.5-32B-Instruct on DAPO-25k with SvS (SvS Table 2, "SvS on D25k").

DAPO-25k is DAPO-17k plus 8,000 open-ended-answer problems from DeepMath: give both files
(they are read one after the other into one training set). Answers are no longer all integers,
so matching is math-verify's general one. Settings: `configs.base.paper`.

  python -m launch.train --config=configs/svs_dapo25k_qwen25_32b.py \\
      --config.model.path=/path/to/hf_model --config.data.train_path=/path/to/dapo17k.parquet \\
      --config.data.extra_train_paths=/path/to/deepmath_open_8k.parquet \\
      --config.sampler.urls=http://10.0.0.2:8000,http://10.0.0.3:8000
"""

from configs import base


def get_config():
  return base.paper("svs_dapo25k_qwen25_32b", steps=600, method="svs", fsdp=8)
