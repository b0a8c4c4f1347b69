"""The hang-proof math-verify process pool: `RewardPool` and `score`.

Workers start from a forkserver with math-verify imported (nothing is forked
from a parent that holds JAX). Each item is reported as it finishes, so an
item that overruns its time (or kills its worker) is pinned exactly: the
worker is killed and replaced, the item scores 0 and is counted, and the rest
of its chunk is re-queued. Workers end with the process that made the pool, kill -9
included.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from typing import Callable, Sequence

import numpy as np

from rlvr.rewards.config import RewardConfig, ScoreResult
from rlvr.rewards.equivalence import _quick_verdict, is_equivalent, is_well_formed
from rlvr.rewards.extraction import extract_answer

_LOG = logging.getLogger(__name__)
# Worker -> parent status codes.
_WRONG, _RIGHT, _TIMEOUT, _ERROR = 0, 1, 2, 3
# A worker gets this long to import math-verify (spawn start, loaded machine) before its first item.
_STARTUP_LIMIT_S = 120.0


def _check_inputs(responses: Sequence[str], answers: Sequence) -> list[str]:
  """Reference answers as strings; clear errors for mismatched lengths and bad rows."""
  if isinstance(responses, str) or isinstance(answers, str):
    raise TypeError("responses, answers: expected sequences of strings, got a single str")
  if len(responses) != len(answers):
    raise ValueError(f"responses / answers: lengths differ ({len(responses)} vs {len(answers)})")
  for i, r in enumerate(responses):
    if not isinstance(r, str):
      raise TypeError(f"responses[{i}]: expected str, got {type(r).__name__}")
  golds = []
  for i, a in enumerate(answers):
    if isinstance(a, bool) or not isinstance(a, (str, int)):
      raise TypeError(f"answers[{i}]: expected str or int, got {type(a).__name__}")
    a = str(a).strip()
    if not a:
      raise ValueError(f"answers[{i}]: empty reference answer")
    golds.append(a)
  return golds


def _worker_main(conn, judge: Callable) -> None:
  """Worker loop: receive (integer_answers, timeout_s, [(key, pred, gold)]), answer per item.

  One message per item lets the parent see which item is running, so a hang
  is pinned on the right item and the rest of the chunk is re-queued.
  """
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
  _exit_with_parent()
  # Timeouts come back as counts in ScoreResult; math-verify's per-item warnings would flood logs.
  logging.getLogger("math_verify").setLevel(logging.ERROR)
  import math_verify  # noqa: F401 - imported before "ready", so no item pays for it

  conn.send(None)  # started: later deaths are the items' doing
  while True:
    try:
      msg = conn.recv()
    except (EOFError, OSError):
      return
    if msg is None:
      return
    integer_answers, timeout_s, items = msg
    for key, pred, gold in items:
      start = time.monotonic()
      try:
        status = _RIGHT if judge(pred, gold, integer_answers, timeout_s) else _WRONG
      except Exception:  # noqa: BLE001 - any failure of one answer scores it 0
        status = _ERROR
      if status == _WRONG and time.monotonic() - start >= timeout_s:
        status = _TIMEOUT  # math-verify's own alarm cut it short
      conn.send((key, status))


def _exit_with_parent() -> None:
  """Kills this worker once the process that started it has ended, however it ended (a
  daemonic worker is ended only by a parent that exits normally, and one busy with an item
  never reads its pipe's end): a thread waits on the parent's sentinel."""
  sentinel = multiprocessing.parent_process().sentinel

  def watch():
    multiprocessing.connection.wait([sentinel])
    os.kill(os.getpid(), signal.SIGKILL)

  threading.Thread(target=watch, name="rlvr-parent-watch", daemon=True).start()


@dataclasses.dataclass
class _Worker:
  process: multiprocessing.process.BaseProcess
  conn: multiprocessing.connection.Connection
  chunk: list = dataclasses.field(default_factory=list)
  done: int = 0
  since: float = 0.0  # when the current item started
  ready: bool = False  # its start-up message has arrived


class RewardPool:
  """Worker processes that run math-verify, surviving hangs and crashes.

  Items are sent in chunks; each worker reports every item as it finishes.
  An item running longer than `timeout_s + grace_s` gets its worker killed
  (SIGKILL) and replaced: the item scores 0 and counts as a timeout, the
  rest of its chunk goes back to the queue. A worker that dies (segfault,
  OOM kill) likewise costs only its current item (counted in `errors`).

  Workers come from a "forkserver" that has math-verify imported, so a
  replacement starts in milliseconds and nothing is forked from a parent
  that holds JAX threads. `timeout_s=None` uses each call's `config.timeout_s`.
  `judge(pred, gold, integer_answers, timeout_s) -> bool` must be a
  module-level function (it is pickled by name); default `is_equivalent`.
  One `score` call at a time (calls are serialised by a lock).
  """

  def __init__(
    self,
    workers: int = 2,
    timeout_s: float | None = None,
    grace_s: float = 2.0,
    judge: Callable = is_equivalent,
    start_method: str = "forkserver",
  ):
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
      raise ValueError(f"RewardPool.workers: expected an int >= 1, got {workers!r}")
    if timeout_s is not None and not (timeout_s > 0 and math.isfinite(timeout_s)):
      raise ValueError(
        f"RewardPool.timeout_s: expected None or positive seconds, got {timeout_s!r}"
      )
    if not grace_s >= 0:
      raise ValueError(f"RewardPool.grace_s: expected seconds >= 0, got {grace_s!r}")
    self.timeout_s = timeout_s
    self.grace_s = grace_s
    self._judge = judge
    self._ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
      # Only takes effect if this interpreter's fork server is not running yet.
      self._ctx.set_forkserver_preload(["rlvr.rewards.pool", "math_verify"])
    self._lock = threading.Lock()
    self._closed = False
    self.restarts = 0  # workers replaced after a hang or a death
    self._workers = [self._start_worker() for _ in range(workers)]

  def _start_worker(self) -> _Worker:
    parent_conn, child_conn = self._ctx.Pipe(duplex=True)
    process = self._ctx.Process(
      target=_worker_main, args=(child_conn, self._judge), daemon=True, name="rlvr-reward-worker"
    )
    process.start()
    child_conn.close()
    return _Worker(process, parent_conn)

  def _replace(self, i: int) -> None:
    """Kill worker i (if still alive) and start a fresh one in its slot."""
    w = self._workers[i]
    if w.process.is_alive():
      w.process.kill()
    w.process.join(timeout=5)
    w.conn.close()
    self._workers[i] = self._start_worker()
    self.restarts += 1

  def __enter__(self) -> RewardPool:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    """Stops the workers (politely, then by force)."""
    if self._closed:
      return
    self._closed = True
    for w in self._workers:
      try:
        w.conn.send(None)
      except (OSError, ValueError):
        pass
    deadline = time.monotonic() + 2.0
    for w in self._workers:
      w.process.join(timeout=max(0.0, deadline - time.monotonic()))
      if w.process.is_alive():
        w.process.kill()
        w.process.join(timeout=5)
      w.conn.close()

  def score(
    self, responses: Sequence[str], answers: Sequence[str], config: RewardConfig = RewardConfig()
  ) -> ScoreResult:
    """Rewards of `responses` against reference `answers` (same length)."""
    golds = _check_inputs(responses, answers)
    n = len(responses)
    extracted, well_formed = [None] * n, np.zeros(n, bool)
    correct, failed = np.zeros(n, bool), np.zeros(n, bool)
    # Identical (answer, gold) pairs (common within a GRPO group) are judged once.
    jobs: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    for i, (response, gold) in enumerate(zip(responses, golds)):
      try:
        pred = extracted[i] = extract_answer(response, config.extraction)
        well_formed[i] = is_well_formed(pred, config.integer_answers)
        quick = _quick_verdict(pred, gold, config.integer_answers)
      except Exception:  # noqa: BLE001 - a response the parent cannot read scores 0, counted
        _LOG.warning("reward: response %d could not be read (scored 0)", i, exc_info=True)
        well_formed[i], failed[i] = False, True
        continue
      if quick is None:
        jobs[(pred, gold)].append(i)
      else:
        correct[i] = quick
    timeouts, errors = 0, int(failed.sum())
    if jobs:
      statuses = self._run(list(jobs), config)
      for key, status in statuses.items():
        rows = jobs[key]
        correct[rows] = status == _RIGHT
        failed[rows] = status in (_TIMEOUT, _ERROR)
        timeouts += len(rows) * (status == _TIMEOUT)
        errors += len(rows) * (status == _ERROR)
    well_formed &= ~failed
    rewards = correct.astype(np.float32)
    return ScoreResult(
      rewards=rewards.astype(np.float32),
      correct=correct,
      well_formed=well_formed,
      extracted=extracted,
      timeouts=int(timeouts),
      errors=int(errors),
    )

  def _run(self, keys: list[tuple[str, str]], config: RewardConfig) -> dict:
    """Statuses of (pred, gold) jobs, keyed by job; survives hung and dead workers."""
    with self._lock:
      if self._closed:
        raise RuntimeError("RewardPool: score() called after close()")
      batch = _Batch(keys, len(self._workers))
      try:
        while batch.pending or batch.busy:
          self._dispatch(batch, config)
          self._collect(batch, (self.timeout_s or config.timeout_s) + self.grace_s)
      except BaseException:
        for i in list(batch.busy):  # their late results must not leak into
          self._replace(i)  # the next call
        raise
      return {keys[j]: status for j, status in batch.statuses.items()}

  def _dispatch(self, batch: _Batch, config: RewardConfig) -> None:
    """Gives a chunk to every idle worker (replacing any that died while idle)."""
    for i, w in enumerate(self._workers):
      if i in batch.busy or not batch.pending:
        continue
      if not w.process.is_alive():
        self._replace(i)
        w = self._workers[i]
      chunk = batch.pending.popleft()
      try:
        w.conn.send((config.integer_answers, config.timeout_s, chunk))
      except (OSError, ValueError):
        batch.pending.appendleft(chunk)
        self._drain(batch, i)
        self._check_started(i)
        self._replace(i)
        continue
      w.chunk, w.done, w.since = chunk, 0, time.monotonic()
      batch.busy.add(i)

  def _drain(self, batch: _Batch, i: int) -> bool:
    """Records the results worker i has sent; False once its pipe is closed."""
    w = self._workers[i]
    try:
      while w.conn.poll():
        msg = w.conn.recv()
        if msg is None:
          w.ready, w.since = True, time.monotonic()  # the clock starts when it can work
          continue
        key, status = msg
        batch.statuses[key] = status
        w.done += 1
        w.since = time.monotonic()
    except (EOFError, OSError):
      return False
    if w.done == len(w.chunk):
      batch.busy.discard(i)
    return True

  def _check_started(self, i: int) -> None:
    """Raises when worker i died before it could start: replacing it would loop forever."""
    w = self._workers[i]
    if w.ready or w.process.is_alive():
      return
    w.process.join(timeout=5)
    raise RuntimeError(
      f"RewardPool: a worker died while starting (exit code {w.process.exitcode}); see its "
      "stderr. A script that creates a pool must guard its entry point with "
      "`if __name__ == '__main__':` (workers re-import the main module)."
    )

  def _fail_current(self, batch: _Batch, i: int, status: int) -> None:
    """Scores worker i's running item `status`, re-queues the rest of its chunk, replaces it."""
    w = self._workers[i]
    self._drain(batch, i)
    self._check_started(i)
    if i in batch.busy:
      batch.statuses[w.chunk[w.done][0]] = status
      if w.done + 1 < len(w.chunk):
        batch.pending.appendleft(w.chunk[w.done + 1 :])
      batch.busy.discard(i)
    self._replace(i)

  def _collect(self, batch: _Batch, limit_s: float) -> None:
    """Waits for results, a death, or the earliest per-item deadline, and handles it."""
    busy = sorted(batch.busy)
    if not busy:
      return
    deadline = lambda i: (
      self._workers[i].since + (limit_s if self._workers[i].ready else _STARTUP_LIMIT_S)
    )
    wait_s = max(0.0, min(deadline(i) for i in busy) - time.monotonic())
    conns = {self._workers[i].conn: i for i in busy}
    sentinels = {self._workers[i].process.sentinel: i for i in busy}
    ready = multiprocessing.connection.wait([*conns, *sentinels], timeout=wait_s)
    dead = {sentinels[obj] for obj in ready if obj in sentinels}
    dead |= {conns[obj] for obj in ready if obj in conns and not self._drain(batch, conns[obj])}
    for i in sorted(dead):
      self._fail_current(batch, i, _ERROR)
    now = time.monotonic()
    for i in sorted(batch.busy):
      if now > deadline(i):
        self._fail_current(batch, i, _TIMEOUT)


class _Batch:
  """Book-keeping of one `score` call: queued chunks, busy worker slots, results so far."""

  def __init__(self, keys: list[tuple[str, str]], workers: int):
    size = max(1, min(256, math.ceil(len(keys) / (4 * workers))))
    # Sorted by gold: a worker then meets each gold in a run and parses it once.
    items = sorted(((j, pred, gold) for j, (pred, gold) in enumerate(keys)), key=lambda x: x[2])
    self.pending = collections.deque(items[k : k + size] for k in range(0, len(items), size))
    self.busy: set[int] = set()
    self.statuses: dict[int, int] = {}


def score(
  responses: Sequence[str],
  answers: Sequence[str],
  config: RewardConfig = RewardConfig(),
  pool: RewardPool | None = None,
) -> ScoreResult:
  """`pool.score(...)`, or with a temporary pool (seconds to start: keep one in a loop)."""
  if pool is not None:
    return pool.score(responses, answers, config)
  with RewardPool(workers=2) as temp:
    return temp.score(responses, answers, config)
