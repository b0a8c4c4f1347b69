"""Multi-host set-up and global batches from per-process data."""

from __future__ import annotations

import os

import jax
import numpy as np

from rlvr import sharding


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """`jax.distributed.initialize` from arguments or the environment.

  Environment: RLVR_COORDINATOR (host:port), RLVR_NUM_PROCESSES, RLVR_PROCESS_ID.
  With none of them set and a single process, does nothing and returns False.
  On TPU pods / SLURM, `coordinator="auto"` lets JAX discover everything.
  """
  coordinator = coordinator or os.environ.get("RLVR_COORDINATOR")
  if num_processes is None and "RLVR_NUM_PROCESSES" in os.environ:
    num_processes = int(os.environ["RLVR_NUM_PROCESSES"])
  if process_id is None and "RLVR_PROCESS_ID" in os.environ:
    process_id = int(os.environ["RLVR_PROCESS_ID"])
  if coordinator == "auto":
    jax.distributed.initialize()
    return True
  if coordinator is None:
    if num_processes not in (None, 1):
      raise ValueError("num_processes > 1 needs a coordinator address (RLVR_COORDINATOR)")
    return False
  if num_processes is None or process_id is None:
    raise ValueError(f"coordinator {coordinator}: set num_processes and process_id too")
  jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)
  return True


def global_batch(local_tree, mesh, rules=None):
  """Per-process rows -> global arrays split over the data-parallel mesh axes.

  Each process passes its own slice of the batch (its rows, in process order);
  leaves that are None stay None.
  """
  def put(x):
    x = np.asarray(x)
    return jax.make_array_from_process_local_data(
        sharding.batch_sharding(mesh, x.ndim, rules), x)
  return jax.tree.map(put, local_tree)
