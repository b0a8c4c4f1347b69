"""Composition-RL across domains on Qwen3-4B-Base: q1 from physics (MegaScience, filtered
to the ~8.2K prompts math-verify judges reliably), q2 from MATH-12k, answer the math
one (docs/methods.md#composition-rl-settings; the paper's Table 2).

Plain GRPO with Composition-RL's settings on the composed set (paper:
Physics-MATH-Composition-141K), same number of updates as its baselines.

  python -m launch.compose --source=physics.jsonl --second_source=math12k.parquet --depth=2 \\
      --n=141000 --out=physics_math.jsonl --url=http://assistant:8000 --model=Qwen2.5-32B-Instruct
  python -m launch.train --config=configs/composition_cross_domain_qwen3_4b.py \\
      --config.model.path=/path/to/Qwen3-4B-Base --config.data.train_path=physics_math.jsonl \\
      --config.sampler.urls=http://10.0.0.2:8000
"""

from configs import base, rlvr_math12k_qwen3_4b


def get_config():
  return rlvr_math12k_qwen3_4b.composition_rl(
    base.paper("composition_cross_domain_qwen3_4b", steps=300)
  )
