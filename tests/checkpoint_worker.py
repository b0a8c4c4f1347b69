"""Checkpoints on two processes (JAX's multi-controller runtime, one CPU device each) for
tests/run/test_checkpoint_integrity.py, which also imports the tiny model and states from here.

  python tests/checkpoint_worker.py save DIR --process_id I --port P     # steps 1 and 2
  python tests/checkpoint_worker.py resume DIR --process_id I --port P   # restore_or_init

`resume` prints "resumed step S equal True|False" (the restored state against the one
step S saved), or "error: ..." and exits 3 when no checkpoint verifies.
"""

from __future__ import annotations

import argparse
import sys

from rlvr.model.config import ModelConfig
from rlvr.model.tiny import TINY

MODEL = ModelConfig(**dict(TINY, vocab_size=64, max_position_embeddings=64, eos_token_id=1))


def learner_config():
  from rlvr import learner

  return learner.LearnerConfig(learning_rate=1e-3)


def base_state(mesh):
  import jax

  from rlvr import learner
  from rlvr.model import decoder

  params = decoder.init(MODEL, jax.random.PRNGKey(0))
  return learner.init_state(MODEL, learner_config(), params, mesh)


def state_at(base, step: int):
  """A distinct state per step: every float leaf (params, AdamW moments) moved by `step`."""
  import jax
  import jax.numpy as jnp

  return jax.tree.map(
    lambda x: x + 0.25 * step if jnp.issubdtype(x.dtype, jnp.floating) else x, base
  )


def _no_params():
  raise AssertionError("a resumed run does not load fresh parameters")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("phase", choices=("save", "resume"))
  ap.add_argument("directory")
  ap.add_argument("--process_id", type=int, required=True)
  ap.add_argument("--port", type=int, required=True)
  a = ap.parse_args()

  import jax
  import jax.numpy as jnp
  import numpy as np

  jax.config.update("jax_num_cpu_devices", 1)
  from rlvr.parallel import distributed, sharding
  from rlvr.run import checkpoint, checkpoint_integrity

  distributed.initialize(f"127.0.0.1:{a.port}", 2, a.process_id)
  mesh = sharding.make_mesh({"fsdp": 2})
  base = base_state(mesh)
  if a.phase == "save":
    mngr = checkpoint.manager(a.directory)
    for step in (1, 2):
      checkpoint.save(mngr, state_at(base, step), {"step": step})
    mngr.close()
    return
  try:
    mngr, state, meta = checkpoint.restore_or_init(
      a.directory, MODEL, learner_config(), mesh, _no_params
    )
  except checkpoint_integrity.CheckpointError as e:
    print(f"error: {e}", flush=True)
    sys.exit(3)
  mngr.close()
  want = state_at(base, meta["step"])
  same = [
    bool(np.asarray(jnp.array_equal(x, y).addressable_data(0)))
    for x, y in zip(jax.tree.leaves(state), jax.tree.leaves(want))
  ]
  print(f"resumed step {meta['step']} equal {all(same)}", flush=True)


if __name__ == "__main__":
  main()
