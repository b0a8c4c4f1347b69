"""Child processes that end when the process that started them ends, however it ends.

`start(argv)` runs argv under a tether: a small process (this file, run as a script, standard
library only) that leads a new session and starts argv in it. The tether watches the starting
process itself (a pidfd; its parent pid where there is none), not a descriptor that a child the
starting process forks without exec would hold too, so it sees that process end, kill -9
included, from whichever thread it started the tether (the kernel's parent-death signal follows
the thread instead). The tether then ends its process group: SIGTERM to argv and everything argv
started, and `GRACE_S` later SIGKILL to whatever of them remains.

While the starting process lives the tether is invisible: it forwards SIGTERM and SIGINT to
argv, and when argv ends it ends whatever argv left behind in its process group the same way
(SIGTERM, SIGKILL after `GRACE_S`), then exits with argv's status (128 + N for signal N).

`stop(proc, timeout)` ends a process group from the process that started its leader, whether
that leader (a tether, or any process started in a new session) still runs or not.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time

GRACE_S = 5.0  # between the tether's SIGTERM and SIGKILL to what remains of its process group
_POLL_S = 0.05


def start(argv: list[str], **popen_kwargs) -> subprocess.Popen:
  """`subprocess.Popen(argv, ...)` under a tether (the Popen's process; its process group holds
  argv's processes); the tether's stdin and argv's are /dev/null."""
  cmd = [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), *argv]
  return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True, **popen_kwargs)


def stop(proc: subprocess.Popen, timeout: float) -> None:
  """Ends the process group `proc` leads: SIGTERM to the group, SIGKILL to it if `proc` or any
  other process of the group remains `timeout` seconds later. `proc` may have ended already
  (killed, or on its own): the processes it started may not have."""
  pgid = proc.pid

  def ended() -> bool:
    return proc.poll() is not None and not _group(pgid)

  # A process group keeps its id from reuse while it has a process, so while `proc` or
  # another process of its group lives, no other group has this id.
  if ended():
    return
  _signal_group(pgid, signal.SIGTERM)
  if not _wait(ended, timeout):
    _signal_group(pgid, signal.SIGKILL)
    _wait(ended, GRACE_S)  # a process in uninterruptible sleep ends when it leaves it


def _group(pgid: int) -> list[int]:
  """The live processes of process group `pgid` (zombies aside), from /proc."""
  found = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat", "rb") as f:
        state, _, pgrp = f.read().rsplit(b")", 1)[1].split()[:3]
    except (OSError, ValueError):  # gone meanwhile
      continue
    if int(pgrp) == pgid and state not in (b"Z", b"X"):
      found.append(int(entry))
  return found


def _signal_group(pgid: int, sig: int) -> None:
  try:
    os.killpg(pgid, sig)
  except ProcessLookupError:  # no process left in it
    pass


def _end_own_group() -> None:
  """SIGTERM to every other process of this process's group; SIGKILL to the group, this
  process included, if any of them remains `GRACE_S` later."""
  me = os.getpid()
  _signal_group(me, signal.SIGTERM)
  if not _wait(lambda: _group(me) == [me], GRACE_S):
    _signal_group(me, signal.SIGKILL)


def _wait(done, timeout: float) -> bool:
  """Whether `done()` came true within `timeout` seconds."""
  deadline = time.monotonic() + timeout
  while not done():
    if time.monotonic() >= deadline:
      return False
    time.sleep(_POLL_S)
  return True


def _watch(parent: int):
  """A function that returns once process `parent`, this process's parent, has ended."""
  try:
    pidfd = os.pidfd_open(parent)
  except (AttributeError, OSError):  # no pidfd here, or `parent` already gone
    pidfd = None
  # Still this process's parent after pidfd_open: the pidfd is that process's.
  gone = os.getppid() != parent

  def wait() -> None:
    if gone:
      return
    if pidfd is not None:
      poll = select.poll()
      poll.register(pidfd, select.POLLIN)  # readable once the process has ended
      while not poll.poll():
        pass
      return
    while os.getppid() == parent:  # a child whose parent ends gets another one
      time.sleep(_POLL_S)

  return wait


def _main(parent: int, argv: list[str]) -> int:
  wait_for_parent = _watch(parent)
  child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda signum, _: child.send_signal(signum))

  def orphaned() -> None:
    wait_for_parent()
    _end_own_group()

  threading.Thread(target=orphaned, daemon=True).start()
  code = child.wait()
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  _end_own_group()  # what argv left behind
  return code if code >= 0 else 128 - code


if __name__ == "__main__":
  sys.exit(_main(int(sys.argv[1]), sys.argv[2:]))
