"""Llama-3.1-8B on MATH-12k with SvS.

GRPO: lr 1e-6 constant, weight decay 0.01, 256 prompts x 8 responses per step
(one optimizer step per rollout batch), clip 0.2 / 0.28, dual-clip 3,
token-mean loss, no KL, grad clip 1.0, temperature 1.0, prompt 4096 /
response 8192 tokens (METHODS.md).
SvS: underperforming 12.5%..50%, G_v 8, synthesis reward band 12.5%..62.5%;
ablations in configs/svs_ablations.py.

  python -m launch.train --config=configs/svs_math12k_llama31_8b.py \\
      --config.model.path=/path/to/hf_model --config.data.train_path=/path/to/train.parquet \\
      --config.sampler.urls=http://10.0.0.2:8000,http://10.0.0.3:8000 --workdir=runs/svs_math12k_llama31_8b
"""

from configs import base


def get_config():
  return base.paper("svs_math12k_llama31_8b", steps=300, method="svs")
