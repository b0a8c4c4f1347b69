"""Multi-host set-up, global batches from per-process data, and host-side agreement
between processes (`HostChannel`, `agreed`)."""

from __future__ import annotations

import os
import pickle

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
  if coordinator is None:
    if num_processes not in (None, 1):
      raise ValueError("num_processes > 1 needs a coordinator address (RLVR_COORDINATOR)")
    return False
  # Several processes: XLA:CPU runs a process's programs on a thread pool, and with async
  # dispatch a program can start before the one dispatched ahead of it has ended; the gloo
  # collectives of the two then meet the other processes' in another order ("collective
  # mismatch", seen when programs come from the compilation cache and dispatch quickly).
  # CPU programs run inline instead, one at a time. This reaches only the CPU client: GPU
  # and TPU programs are dispatched as before.
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  if coordinator == "auto":
    jax.distributed.initialize(**timeouts)
    return True
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


_CHUNK = 1 << 20  # bytes per key-value entry
_WAIT_MS = 2 * 3600 * 1000  # a dead peer ends the run sooner (distributed's heartbeat)


class HostChannel:
  """All-gather of bytes between processes through `jax.distributed`'s key-value store.

  Host-side messages to the coordinator, no device collective: a gather may run in a
  worker thread while the learner's jitted update runs its own collectives (a device
  all-gather there could interleave differently on different processes). Calls are
  numbered; every process makes the same calls in the same order. A process deletes
  its entries of call c - 1 once it has read everyone's entries of call c (each peer
  finished reading c - 1 before writing c).
  """

  _count = 0

  def __init__(self):
    self.name = f"rlvr/split{HostChannel._count}"
    HostChannel._count += 1
    self.calls = 0

  def allgather(self, data: bytes) -> list[bytes]:
    from jax._src import distributed

    client = distributed.global_state.client
    me, call = jax.process_index(), self.calls
    self.calls += 1
    key = lambda c, p, k: f"{self.name}/{c}/{p}/{k}"
    chunks = [data[i : i + _CHUNK] for i in range(0, len(data), _CHUNK)] or [b""]
    for k, chunk in enumerate(chunks):
      client.key_value_set_bytes(key(call, me, k), chunk)
    client.key_value_set(key(call, me, "n"), str(len(chunks)))
    out = []
    for p in range(jax.process_count()):
      n = int(client.blocking_key_value_get(key(call, p, "n"), _WAIT_MS))
      out.append(
        b"".join(client.blocking_key_value_get_bytes(key(call, p, k), _WAIT_MS) for k in range(n))
      )
    if call:
      prev = int(client.blocking_key_value_get(key(call - 1, me, "n"), _WAIT_MS))
      for k in [*range(prev), "n"]:
        client.key_value_delete(key(call - 1, me, k))
    return out


def agreed(fn):
  """`fn` over several processes: each process calls it, and every one returns process 0's
  result (through a `HostChannel`). A host-side answer that can differ between processes,
  such as a verdict that timed out under load on one host only, then cannot make their
  batches, and so their programs and collectives, differ. One process: `fn` itself."""
  if jax.process_count() == 1:
    return fn
  channel = HostChannel()

  def call(*args, **kwargs):
    out = fn(*args, **kwargs)
    mine = pickle.dumps(out) if jax.process_index() == 0 else b""
    return pickle.loads(channel.allgather(mine)[0])

  return call
