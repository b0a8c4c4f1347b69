"""Stop on Ctrl-C / SIGTERM between steps, never in the middle of one.

The first SIGINT or SIGTERM asks the loop to stop after the step it is in
(so the state is consistent and a checkpoint can be saved); a second one
stops at once. Loops check `agreed()` after each step (`requested` on any process of a multi-host
run), save, and call `exit(where)`, which prints one line saying where the run stopped and how to
resume, then exits with 128 + the signal number. Both lines print above the progress bar
(`rlvr.common.progress`), not into it.
"""

from __future__ import annotations

import signal
import threading

from rlvr.common import progress


class GracefulStop:
  """Context manager: SIGINT / SIGTERM handlers for the duration of a loop (main thread)."""

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self, phase: str):
    self.phase = phase
    self.signum: int | None = None
    self._previous = {}

  @property
  def requested(self) -> bool:
    return self.signum is not None

  def agreed(self) -> bool:
    """`requested` on any process (multi-host: all stop after the same step, so the
    checkpoint they save together is one step; a collective, so every process calls it)."""
    import jax

    if jax.process_count() == 1:
      return self.requested
    import numpy as np
    from jax.experimental import multihost_utils

    signums = np.asarray(multihost_utils.process_allgather(np.int32(self.signum or 0)))
    if self.signum is None and signums.any():
      self.signum = int(signums[signums > 0][0])  # stop as the signalled process does
    return bool(signums.any())

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None:  # a second signal: stop now
      raise KeyboardInterrupt(signum)
    self.signum = signum
    progress.say(
      f"{signal.Signals(signum).name}: finishing this {self.phase} step, then saving a "
      "checkpoint (signal again to stop at once)"
    )

  def __enter__(self) -> GracefulStop:
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
    return self

  def __exit__(self, *exc) -> None:
    for s, handler in self._previous.items():
      signal.signal(s, handler)

  def exit(self, where: str):
    """Ends the progress bars, prints where the run stopped and exits non-zero (128 + signal)."""
    progress.close_bars()
    progress.say(
      f"stopped by {signal.Signals(self.signum).name} {where}; rerun the same command to resume"
    )
    raise SystemExit(128 + self.signum)
