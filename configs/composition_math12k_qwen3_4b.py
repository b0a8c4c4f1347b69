"""Composition-RL's depth curriculum on Qwen3-4B-Base: MATH-12k, then depth-2, then depth-3
compositions (docs/methods.md#depth-curriculum; the paper's Table 1 rows "Depth 1 + 2",
"+ Depth 3").

GRPO exactly as the baseline (configs/rlvr_math12k_qwen3_4b.py: lr 1e-6, G 8, 256
prompts, dynamic sampling, 16K responses, eval at temperature 0.6 / top_p 0.95 /
top_k 20, avg@32); only the data changes, stage by stage. The paper moves on when
solve_all is high and the held-out score plateaus, each stage from the previous
stage's final checkpoint; here a stage ends after `composition.max_steps` steps or
once solve_all averages `solve_all_threshold` over `window` steps (the paper's
solve_all climbs past 50% within 50 steps and settles near 75%). Composed sets come
from `launch/compose.py` (assistant: Qwen2.5-32B-Instruct behind a vLLM server),
whose rows carry source "composed-d<K>"; MATH-12k rows count as depth 1.

  python -m launch.compose --source=math12k.parquet --depth=2 --n=200000 --out=d2.jsonl \\
      --url=http://assistant:8000 --model=Qwen2.5-32B-Instruct
  python -m launch.compose --source=math12k.parquet --depth=3 --n=200000 --out=d3.jsonl ...
  python -m launch.train --config=configs/composition_math12k_qwen3_4b.py \\
      --config.model.path=/path/to/Qwen3-4B-Base --config.data.train_path=math12k.parquet \\
      --config.data.extra_train_paths=d2.jsonl,d3.jsonl --config.sampler.urls=http://10.0.0.2:8000
"""

from configs import base, rlvr_math12k_qwen3_4b


def get_config():
  c = rlvr_math12k_qwen3_4b.composition_rl(base.paper("composition_math12k_qwen3_4b", steps=600))
  c.method = "composition"
  c.composition.depths = (1, 2, 3)
  c.composition.max_steps = 200  # 600 steps in three stages at most
  c.composition.solve_all_threshold = 0.75
  c.composition.window = 20
  return c
