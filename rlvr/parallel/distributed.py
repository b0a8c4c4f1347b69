"""Multi-host set-up and global batches from per-process data."""

from __future__ import annotations

import os

import jax
import numpy as np

from rlvr.parallel import sharding


def initialize(
  coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> bool:
  """`jax.distributed.initialize` from arguments or the environment.

  Environment: RLVR_COORDINATOR (host:port), RLVR_NUM_PROCESSES, RLVR_PROCESS_ID,
  RLVR_HEARTBEAT_S (default 60: a process that stops answering for this long, e.g.
  killed, makes every other process exit with an error instead of waiting forever).
  With none of them set and a single process, does nothing and returns False.
  On TPU pods / SLURM, `coordinator="auto"` lets JAX discover everything.
  """
  if jax.distributed.is_initialized():
    return True
  timeouts = dict(heartbeat_timeout_seconds=int(os.environ.get("RLVR_HEARTBEAT_S", "60")))
  coordinator = coordinator or os.environ.get("RLVR_COORDINATOR")
  if num_processes is None and "RLVR_NUM_PROCESSES" in os.environ:
    num_processes = int(os.environ["RLVR_NUM_PROCESSES"])
  if process_id is None and "RLVR_PROCESS_ID" in os.environ:
    process_id = int(os.environ["RLVR_PROCESS_ID"])
  if coordinator == "auto":
    jax.distributed.initialize(**timeouts)
    return True
  if coordinator is None:
    if num_processes not in (None, 1):
      raise ValueError("num_processes > 1 needs a coordinator address (RLVR_COORDINATOR)")
    return False
  if num_processes is None or process_id is None:
    raise ValueError(f"coordinator {coordinator}: set num_processes and process_id too")
  jax.distributed.initialize(
    coordinator, num_processes=num_processes, process_id=process_id, **timeouts
  )
  return True


def is_writer() -> bool:
  """Process 0 writes the run's files (metrics, reports, plots, summary); the others
  compute the same things and write nothing."""
  return jax.process_index() == 0


def replicated_batch(tree, mesh, rules=None):
  """Host arrays that every process holds in full (the same on each) -> global arrays
  split over the data-parallel mesh axes; leaves that are None stay None.

  This is how a run feeds the learner: every process draws, samples and scores the
  same global batch (so host-side decisions agree everywhere) and each device takes
  its rows.
  """

  def put(x):
    x = np.asarray(x)
    return sharding.put_global(x, sharding.batch_sharding(mesh, x.ndim, rules))

  return jax.tree.map(put, tree)


def check_shared_workdir(workdir: str) -> None:
  """Every process must see the same work dir (orbax checkpoints and the HF export are
  written there by all / by process 0). A per-host local dir is an error at start-up."""
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils

  token = int(
    multihost_utils.broadcast_one_to_all(np.int32(np.random.SeedSequence().entropy % (1 << 30)))
  )
  marker = os.path.join(workdir, f".shared-check-{token}")
  if is_writer():
    with open(marker, "w") as f:
      f.write("written by process 0\n")
  multihost_utils.sync_global_devices("workdir marker written")
  sees = np.asarray(multihost_utils.process_allgather(np.int32(os.path.exists(marker))))
  multihost_utils.sync_global_devices("workdir marker read")
  if is_writer():
    os.remove(marker)
  if not sees.all():
    missing = [i for i, ok in enumerate(sees.ravel()) if not ok]
    raise RuntimeError(
      f"workdir {workdir}: processes {missing} do not see the file process 0 wrote there; "
      f"every process needs the same work dir on a shared file system (NFS, Lustre, GCS "
      f"fuse) for checkpoints and exports"
    )


def global_batch(local_tree, mesh, rules=None):
  """Per-process rows -> global arrays split over the data-parallel mesh axes.

  Each process passes its own slice of the batch (its rows, in process order);
  leaves that are None stay None.
  """

  def put(x):
    x = np.asarray(x)
    return jax.make_array_from_process_local_data(sharding.batch_sharding(mesh, x.ndim, rules), x)

  return jax.tree.map(put, local_tree)
