"""Qwen2.5-7B-Instruct on 12k PRIME-RL code problems with SvS (SvS Section 5.4, Figure 8).

`configs.base.paper_code` with method "svs": synthetic problems reconstructed from correct
programs (synthesis prompt "code": the problem with its input and output formats and
constraints), and their solutions scored against the original problem's tests, in the sandbox.
The paper reports SvS after about 100 steps matching RLVR after 600
(configs/rlvr_primerl_qwen25_7b.py).

  python -m launch.train --config=configs/svs_primerl_qwen25_7b.py \\
      --config.model.path=/path/to/Qwen2.5-7B-Instruct \\
      --config.data.train_path=/path/to/primerl_code_12k.parquet \\
      --config.sampler.urls=http://10.0.0.2:8000,http://10.0.0.3:8000
"""

from configs import base


def get_config():
  c = base.paper_code("svs_primerl_qwen25_7b", steps=600, method="svs")
  c.svs.template = "code"  # synthesis/prompts/svs_synthesis_code.txt
  return c
