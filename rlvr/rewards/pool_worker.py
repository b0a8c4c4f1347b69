"""The worker process of a `RewardPool` (`rlvr.rewards.pool`): what runs inside it.

`_worker_main` is its loop, which runs each chunk's task and answers item by item;
`_Judge` is math-verify's task; `TIMED_OUT` and `DIED` are what the pool gives for an item
lost to a hang or a death. Workers end with the process that made the pool, kill -9
included (`_exit_with_parent`).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from typing import Callable, Sequence

# Worker -> parent status codes of math-verify's judge.
_WRONG, _RIGHT, _TIMEOUT, _ERROR = 0, 1, 2, 3
# What `RewardPool.run` gives for an item that overran its time, or whose worker ended (or
# whose task raised, or returned what cannot be sent back).
TIMED_OUT, DIED = "timed out", "died"


def _worker_main(conn, preload: Sequence[str] = (), sys_path: Sequence[str] = ()) -> None:
  """Worker loop: receive (task, [(key, payload)]), answer (key, task(payload)) per item.

  One message per item lets the parent see which item is running, so a hang
  is pinned on the right item and the rest of the chunk is re-queued. The worker
  leads a process group of its own: whatever a task forks is killed with it.
  """
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
  os.setpgid(0, 0)
  _exit_with_parent()
  # Timeouts come back as counts in ScoreResult; math-verify's per-item warnings would flood logs.
  logging.getLogger("math_verify").setLevel(logging.ERROR)
  import math_verify  # noqa: F401 - imported before "ready", so no item pays for it

  if sys_path:
    sys.path[:] = list(sys_path)  # the parent's, as it is when the worker starts
  for module in preload:  # the tasks' modules (a user's reward module), imported once here
    try:
      importlib.import_module(module)
    except BaseException:  # noqa: BLE001 - the task that needs it says why
      pass
  me = os.getpid()
  conn.send(None)  # started: later deaths are the items' doing
  while True:
    try:
      msg = conn.recv()
    except (EOFError, OSError):
      return
    if msg is None:
      return
    task, items = msg
    for key, payload in items:
      try:
        result = task(payload)
      except BaseException:  # noqa: BLE001 - SystemExit too: a task never ends the worker
        result = DIED
      if os.getpid() != me:  # a process the task forked returns here: it must not answer
        os._exit(0)
      try:
        conn.send((key, result))
      except (EOFError, OSError):
        return
      except Exception:  # noqa: BLE001 - a result that cannot be pickled
        conn.send((key, DIED))


@dataclasses.dataclass(frozen=True)
class _Judge:
  """math-verify's task: (pred, gold) -> _RIGHT, _WRONG, _TIMEOUT or _ERROR."""

  judge: Callable
  integer_answers: bool
  timeout_s: float

  def __call__(self, item: tuple[str, str]) -> int:
    pred, gold = item
    start = time.monotonic()
    try:
      status = _RIGHT if self.judge(pred, gold, self.integer_answers, self.timeout_s) else _WRONG
    except Exception:  # noqa: BLE001 - any failure of one answer scores it 0
      status = _ERROR
    if status == _WRONG and time.monotonic() - start >= self.timeout_s:
      status = _TIMEOUT  # math-verify's own alarm cut it short
    return status


def _exit_with_parent() -> None:
  """Kills this worker once the process that started it has ended, however it ended (a
  daemonic worker is ended only by a parent that exits normally, and one busy with an item
  never reads its pipe's end): a thread waits on the parent's sentinel."""
  sentinel = multiprocessing.parent_process().sentinel

  def watch():
    multiprocessing.connection.wait([sentinel])
    os.killpg(0, signal.SIGKILL)  # this worker and whatever its tasks forked

  threading.Thread(target=watch, name="rlvr-parent-watch", daemon=True).start()
