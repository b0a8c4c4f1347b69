"""Composition-RL's depth curriculum on Qwen3-30B-A3B-Base (mixture of experts), the
paper's largest gain: MATH-12k, then depth-2, then depth-3 compositions
(docs/methods.md#depth-curriculum). GRPO exactly as the baseline
(configs/rlvr_math12k_qwen3_30b_a3b.py); only the data changes, stage by stage, as in
configs/composition_math12k_qwen3_4b.py (which explains the stage rule and how the
composed sets are built).

  python -m launch.train --config=configs/composition_math12k_qwen3_30b_a3b.py \\
      --config.model.path=/path/to/Qwen3-30B-A3B-Base --config.data.train_path=math12k.parquet \\
      --config.data.extra_train_paths=d2.jsonl,d3.jsonl --config.sampler.urls=http://10.0.0.2:8000
"""

from configs import base, rlvr_math12k_qwen3_4b


def curriculum(c):
  """The depth curriculum of configs/composition_math12k_qwen3_4b.py on a baseline config."""
  c.method = "composition"
  c.composition.depths = (1, 2, 3)
  c.composition.max_steps = 200  # 600 steps in three stages at most
  c.composition.solve_all_threshold = 0.75
  c.composition.window = 20
  return c


def get_config():
  # One 8 x H100 node, as configs/rlvr_math12k_qwen3_30b_a3b.py explains.
  c = base.paper("composition_math12k_qwen3_30b_a3b", steps=600, fsdp=8)
  return curriculum(rlvr_math12k_qwen3_4b.composition_rl(c))
