"""Composition-RL's depth curriculum on Qwen3-14B-Base: MATH-12k, then depth-2, then
depth-3 compositions (docs/methods.md#depth-curriculum), with the paper's settings for
every model size: batch 256 prompts, lr 1e-6, G 8, dynamic sampling, responses up to
16K tokens, evaluation avg@32 at temperature 0.6 / top_p 0.95 / top_k 20 (as
configs/composition_math12k_qwen3_4b.py, which explains the stage rule and how the
composed sets are built). 8 devices: fsdp 4 x tensor 2.

  python -m launch.train --config=configs/composition_math12k_qwen3_14b.py \\
      --config.model.path=/path/to/Qwen3-14B-Base --config.data.train_path=math12k.parquet \\
      --config.data.extra_train_paths=d2.jsonl,d3.jsonl --config.sampler.urls=http://10.0.0.2:8000
"""

from configs import base, composition_math12k_qwen3_30b_a3b, rlvr_math12k_qwen3_4b


def get_config():
  c = base.paper("composition_math12k_qwen3_14b", steps=600)
  return composition_math12k_qwen3_30b_a3b.curriculum(rlvr_math12k_qwen3_4b.composition_rl(c))
