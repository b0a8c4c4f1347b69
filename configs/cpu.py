"""Any shipped config, scaled down to run a few steps on a CPU (`rlvr.run.experiment.scale_down`).

The same method and settings path as the paper run, at a size a laptop finishes in
minutes: the mesh on the local devices, the in-process sampler, short lengths, 4 prompts
per step, a few eval problems. Give it a model (an HF dir, or `launch.make_tiny`'s) and a
training file; any `--config.x=...` after it still applies:

  python -m launch.make_tiny --out=/tmp/tiny --family=qwen2   # or any HF model dir
  python -m launch.train --config=configs/cpu.py:svs_math12k_qwen25_3b \
      --config.model.path=/tmp/tiny --config.data.train_path=tests/fixtures/dapo_math_17k_first500.parquet
"""

import importlib

from rlvr.run import experiment


def get_config(name: str):
  name = name.removesuffix(".py").removeprefix("configs/")
  return experiment.scale_down(importlib.import_module(f"configs.{name}").get_config())
