"""Qwen3-4B-Base on MATH-12k, plain GRPO as Composition-RL ran its baseline.

Composition-RL (docs/methods.md#composition-rl-settings): GRPO with dynamic sampling
(groups refilled to 256 per step), lr 1e-6, G = 8, token-mean loss, 16K response tokens; evaluation
at temperature 0.6, top_p 0.95, top_k 20, avg@32. The rest is `configs.base.paper`.
The composed runs on the same model: configs/composition_math12k_qwen3_4b.py.

  python -m launch.train --config=configs/rlvr_math12k_qwen3_4b.py \\
      --config.model.path=/path/to/Qwen3-4B-Base --config.data.train_path=/path/to/math12k.parquet \\
      --config.sampler.urls=http://10.0.0.2:8000,http://10.0.0.3:8000 --workdir=runs/rlvr_math12k_qwen3_4b
"""

from configs import base


def composition_rl(c):
  """Composition-RL's GRPO and evaluation settings on top of `base.paper`."""
  c.rl.loop.max_response_len = 16384
  c.rl.loop.max_extra_rounds = 4  # dynamic sampling refills the batch (DAPO-style)
  c.eval.sampling.n = 32  # avg@32
  c.eval.sampling.temperature = 0.6
  c.eval.sampling.top_p = 0.95
  c.eval.sampling.top_k = 20
  c.eval.sampling.max_tokens = 32768 - 4096  # paper: 32K output; our Qwen3 context is 32K
  return c


def get_config():
  return composition_rl(base.paper("rlvr_math12k_qwen3_4b", steps=300))
