"""Qwen2.5-7B-Instruct on 12k PRIME-RL code problems with plain GRPO (SvS Section 5.4's RLVR
baseline; configs/svs_primerl_qwen25_7b.py is the SvS run).

`configs.base.paper_code`: the SvS paper's GRPO settings, rewards from the problems' tests run
in the bubblewrap sandbox (reward.domain = "code"), HumanEval before and after RL.

  python -m launch.train --config=configs/rlvr_primerl_qwen25_7b.py \\
      --config.model.path=/path/to/Qwen2.5-7B-Instruct \\
      --config.data.train_path=/path/to/primerl_code_12k.parquet \\
      --config.sampler.urls=http://10.0.0.2:8000,http://10.0.0.3:8000
"""

from configs import base


def get_config():
  return base.paper_code("rlvr_primerl_qwen25_7b", steps=600)
