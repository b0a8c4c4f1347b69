"""The SFT'd arithmetic policies the session's fixtures share: a tiny model after 300 SFT
steps on worked solutions plus their inverse pairs (as the embedded default's warm start),
trained in a child process that compiles as a user's run does. The pytest processes compile
quickly and run slowly (`tiny_run.QUICK_COMPILE`); this SFT computes for longer than it
compiles: 45 s in a child against 76 s in-process, on 2 cores of an AMD EPYC.

  python tests/sft_policy.py MODEL_DIR OUT_DIR arithmetic|code
"""

from __future__ import annotations

import os
import subprocess
import sys

KINDS = ("arithmetic", "code")


def problems(kind: str):
  """The 300 problems SFT sees: worked solutions (the first 300 of 364: the arithmetic
  fixture evaluates on the other 64), or (code) solutions that are programs."""
  from rlvr.data.tasks import arithmetic

  if kind == "code":
    train, _ = arithmetic.make_splits(300, 0, max_operand=9)
    return [arithmetic.as_program(p) for p in train]
  train, _ = arithmetic.make_splits(300 + 64, 0, max_operand=9)
  return train[:300]


def train(model_dir: str, out_dir: str, kind: str) -> str:
  """The SFT'd HF dir, trained by a child process (its output in the error if it fails)."""
  import tiny_run

  argv = [sys.executable, os.path.abspath(__file__), model_dir, out_dir, kind]
  done = subprocess.run(argv, env=tiny_run.env(), capture_output=True, text=True, timeout=1800)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout.strip().splitlines()[-1]


def _sft(model_dir: str, out_dir: str, kind: str) -> str:
  import jax

  from rlvr import learner
  from rlvr.data.tasks import arithmetic
  from rlvr.parallel import sharding
  from rlvr.run.sft import train_sft

  seen = problems(kind)
  pairs = [(p.problem, p.solution) for p in seen] + [arithmetic.inverse_pair(p) for p in seen]
  lc = learner.LearnerConfig(
    learning_rate=3e-3,
    weight_decay=0.0,
    lr_schedule="cosine",
    warmup_steps=20,
    total_steps=300,
    min_lr_ratio=0.1,
    dual_clip=None,
  )
  mesh = sharding.make_mesh({"fsdp": 1}, jax.devices()[:1])
  return train_sft(
    model_dir, pairs, out_dir, learner_cfg=lc, mesh=mesh, steps=300, batch_size=32, progress=False
  )


if __name__ == "__main__":
  model_dir, out_dir, kind = sys.argv[1:]
  assert kind in KINDS, kind
  print(_sft(model_dir, out_dir, kind))
