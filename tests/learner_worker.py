"""Learner runs in their own processes (multi-host, resume); also imported by tests.

python tests/learner_worker.py --model DIR --out OUT.npz --steps 3 --mesh fsdp=4
    [--process_id I --num_processes N --port P] [--ckpt DIR --save_at K | --resume]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

B, T = 8, 40


def make_batch(step: int, vocab: int):
  """Deterministic batch number `step`: left-padded prompts, completions from t=16."""
  rng = np.random.RandomState(100 + step)
  tokens = rng.randint(3, vocab - 70, (B, T)).astype(np.int32)
  seg = np.ones((B, T), np.int32)
  for i in range(B):
    seg[i, : rng.randint(0, 6)] = 0
  tokens = np.where(seg == 1, tokens, 0)
  loss_mask = np.zeros((B, T), np.float32)
  loss_mask[:, 16:] = 1
  for i in range(B):
    loss_mask[i, 16 + rng.randint(4, T - 16) :] = 0  # ragged completion lengths
  adv = rng.randn(B).astype(np.float32)
  return dict(tokens_bt=tokens, segment_bt=seg, loss_mask_bt=loss_mask, advantages=adv)


def learner_config(**kw):
  """Test settings. adam_eps 1e-3 (not 1e-8): f32 gradient sums taken in another order
  (micro-batches, shards, processes) differ by ~3e-8 absolute (5e-7 of the largest
  gradient), and Adam's step lr * g / (|g| + eps) turns that into a 1% weight-update
  difference for gradients near 1e-6. With eps 1e-3 the update stays proportional to
  the gradient there, so comparing weights at rtol 1e-5 checks the gradients."""
  from rlvr import learner

  return learner.LearnerConfig(
    **{"learning_rate": 1e-3, "weight_decay": 0.01, "adam_eps": 1e-3, **kw}
  )


def parse_mesh(s: str) -> dict[str, int]:
  return {k: int(v) for k, v in (p.split("=") for p in s.split(","))}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", required=True)
  ap.add_argument("--out", required=True)
  ap.add_argument("--steps", type=int, default=3)
  ap.add_argument("--mesh", default="fsdp=-1")
  ap.add_argument("--devices", type=int, default=4)
  ap.add_argument("--process_id", type=int, default=0)
  ap.add_argument("--num_processes", type=int, default=1)
  ap.add_argument("--port", type=int, default=0)
  ap.add_argument("--ckpt", default=None)
  ap.add_argument("--save_at", type=int, default=-1)
  ap.add_argument("--resume", action="store_true")
  ap.add_argument("--export", default=None, help="also save_hf the final policy here")
  a = ap.parse_args()

  import jax

  jax.config.update("jax_num_cpu_devices", a.devices)
  from rlvr import learner, model
  from rlvr.parallel import distributed, sharding
  from rlvr.run import checkpoint

  if a.num_processes > 1:
    distributed.initialize(f"127.0.0.1:{a.port}", a.num_processes, a.process_id)
  cfg, params = model.load_hf(a.model)
  lc = learner_config()
  mesh = sharding.make_mesh(parse_mesh(a.mesh))
  update = learner.make_update_fn(cfg, lc, mesh)
  mngr = checkpoint.manager(a.ckpt) if a.ckpt else None
  if a.resume:
    state, meta = checkpoint.restore(mngr, checkpoint.abstract_state(cfg, lc, mesh))
    start = meta["data_position"]
  else:
    state = learner.init_state(cfg, lc, params, mesh)
    start = 0
  for step in range(start, a.steps):
    full = make_batch(step, cfg.vocab_size)
    rows = B // a.num_processes
    local = {k: v[a.process_id * rows : (a.process_id + 1) * rows] for k, v in full.items()}
    batch = learner.TrainBatch(**distributed.global_batch(local, mesh))
    state, metrics = update(state, batch)
    if mngr is not None and step + 1 == a.save_at:
      checkpoint.save(mngr, state, {"data_position": step + 1})
  if a.export:  # every process calls it: tensors are gathered one by one, process 0 writes
    model.save_hf(a.export, cfg, state.params)
  from jax.experimental import multihost_utils

  host = multihost_utils.process_allgather(state.params, tiled=True)
  if a.process_id == 0:
    flat = {
      "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
      for path, v in jax.tree_util.tree_leaves_with_path(host)
    }
    flat["__step__"] = np.asarray(jax.device_get(state.step))
    np.savez(a.out, **flat)
  if mngr is not None:
    mngr.close()


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  main()
