"""The hang-proof reward process pool: `RewardPool` and `score`.

Workers (`rlvr.rewards.pool_worker`) start from a forkserver with math-verify imported
(nothing is forked from a parent that holds JAX). They run math-verify's judge
(`RewardPool.score`) and any other picklable task (`RewardPool.run`: the user's reward
functions, `rlvr.rewards.custom_caller`). Each item is reported as it finishes, so an item
that overruns its time (or kills its worker) is pinned exactly: the worker and every
process it forked are killed, a fresh worker takes its slot, the item is marked
(`TIMED_OUT`, `DIED`) and the rest of its chunk is re-queued.
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
import sys
import threading
import time
from typing import Callable, Sequence

import numpy as np

from rlvr.rewards.config import RewardConfig, ScoreResult
from rlvr.rewards.equivalence import _quick_verdict, is_equivalent, is_well_formed
from rlvr.rewards.extraction import extract_answer
from rlvr.rewards.pool_worker import _ERROR, _RIGHT, _TIMEOUT, DIED, TIMED_OUT, _Judge, _worker_main

_LOG = logging.getLogger(__name__)
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


@dataclasses.dataclass
class _Worker:
  process: multiprocessing.process.BaseProcess
  conn: multiprocessing.connection.Connection
  chunk: list = dataclasses.field(default_factory=list)
  done: int = 0
  since: float = 0.0  # when the current item started
  ready: bool = False  # its start-up message has arrived


class RewardPool:
  """Worker processes that run math-verify (and other tasks), surviving hangs and crashes.

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
  `preload`: modules each worker imports before its first item (a user's reward module:
  its import time does not count against an item's). One `score` or `run` call at a time
  (calls are serialised by a lock).
  """

  TIMED_OUT, DIED = TIMED_OUT, DIED  # what `run` gives for an item lost to a hang, a death

  def __init__(
    self,
    workers: int = 2,
    timeout_s: float | None = None,
    grace_s: float = 2.0,
    judge: Callable = is_equivalent,
    start_method: str = "forkserver",
    preload: Sequence[str] = (),
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
    self._preload = tuple(preload)
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
      target=_worker_main,
      args=(child_conn, self._preload, list(sys.path)),
      daemon=True,
      name="rlvr-reward-worker",
    )
    process.start()
    child_conn.close()
    return _Worker(process, parent_conn)

  def _replace(self, i: int) -> None:
    """Kill worker i (if still alive) and start a fresh one in its slot."""
    w = self._workers[i]
    _kill_group(w.process)
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
      _kill_group(w.process)  # the worker if it is still running, and what it forked
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
    task = _Judge(self._judge, config.integer_answers, config.timeout_s)
    limit_s = (self.timeout_s or config.timeout_s) + self.grace_s
    results = self.run(task, keys, limit_s, order=lambda key: key[1])  # by gold: parsed once
    lost = {TIMED_OUT: _TIMEOUT, DIED: _ERROR}
    return {key: lost.get(r, r) if isinstance(r, str) else r for key, r in zip(keys, results)}

  def run(
    self, task: Callable, payloads: Sequence, limit_s: float, order: Callable | None = None
  ) -> list:
    """[task(payload) for payload in payloads], computed in the workers; an item that ran
    longer than `limit_s` is `TIMED_OUT`, one whose worker ended (its task raised, exited or
    was killed) `DIED`. `task` is pickled with each chunk (a module-level function, or an
    instance of a module-level class); `order`: a sort key that groups payloads into chunks."""
    with self._lock:
      if self._closed:
        raise RuntimeError("RewardPool: score() called after close()")
      batch = _Batch(payloads, len(self._workers), order)
      try:
        while batch.pending or batch.busy:
          self._dispatch(batch, task)
          self._collect(batch, limit_s)
      except BaseException:
        for i in list(batch.busy):  # their late results must not leak into
          self._replace(i)  # the next call
        raise
      return [batch.statuses[j] for j in range(len(payloads))]

  def _dispatch(self, batch: _Batch, task: Callable) -> None:
    """Gives a chunk to every idle worker (replacing any that died while idle)."""
    for i, w in enumerate(self._workers):
      if i in batch.busy or not batch.pending:
        continue
      if not w.process.is_alive():
        self._replace(i)
        w = self._workers[i]
      chunk = batch.pending.popleft()
      try:
        w.conn.send((task, chunk))
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

  def _fail_current(self, batch: _Batch, i: int, status: str) -> None:
    """Marks worker i's running item `status` (TIMED_OUT, DIED), re-queues the rest of its chunk, replaces it."""
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
      self._fail_current(batch, i, DIED)
    now = time.monotonic()
    for i in sorted(batch.busy):
      if now > deadline(i):
        self._fail_current(batch, i, TIMED_OUT)


def _kill_group(process: multiprocessing.process.BaseProcess) -> None:
  """SIGKILL to a worker's process group (the worker and whatever its tasks forked), or to
  the worker alone if it died before it could lead one."""
  if process.pid is None:
    return
  try:
    os.killpg(process.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    if process.is_alive():
      process.kill()


class _Batch:
  """Book-keeping of one `run` call: queued chunks, busy worker slots, results so far."""

  def __init__(self, payloads: Sequence, workers: int, order: Callable | None = None):
    size = max(1, min(256, math.ceil(len(payloads) / (4 * workers))))
    items = list(enumerate(payloads))
    if order is not None:
      items.sort(key=lambda item: order(item[1]))
    self.pending = collections.deque(items[k : k + size] for k in range(0, len(items), size))
    self.busy: set[int] = set()
    self.statuses: dict[int, object] = {}


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
