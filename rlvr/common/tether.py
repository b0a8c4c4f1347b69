"""Child processes that end when the process that started them ends, however it ends.

`start(argv)` runs argv under a tether: a small process (this file, run as a script, standard
library only) that leads a new session, starts argv in it, and holds the read end of a pipe
whose only write end stays in the starting process. The pipe reaches end-of-file when that
process ends, kill -9 included, from whichever thread it started the child (the kernel's
parent-death signal follows the thread instead). The tether then sends argv SIGTERM, and
after `GRACE_S` SIGKILLs the whole session: argv and everything it started.

While the starting process lives the tether is invisible: it forwards SIGTERM and SIGINT to
argv, ends when argv does with its exit status (128 + N for signal N), and then ends whatever
argv left behind in its process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

GRACE_S = 5.0  # between SIGTERM and SIGKILL once the starting process is gone


def start(argv: list[str], **popen_kwargs) -> subprocess.Popen:
  """`subprocess.Popen(argv, ...)` under a tether (the Popen's process; its process group holds
  argv's processes); stdin is the tether's pipe, argv's stdin is /dev/null."""
  cmd = [sys.executable, "-I", "-S", os.path.abspath(__file__), *argv]
  return subprocess.Popen(cmd, stdin=subprocess.PIPE, start_new_session=True, **popen_kwargs)


def _main(argv: list[str]) -> int:
  child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda signum, _: child.send_signal(signum))
  orphaned = threading.Event()

  def watch() -> None:
    while os.read(0, 1 << 12):  # the starting process never writes: only end-of-file comes
      pass
    orphaned.set()
    child.terminate()
    try:
      child.wait(GRACE_S)
    finally:
      os.killpg(0, signal.SIGKILL)

  threading.Thread(target=watch, daemon=True).start()
  code = child.wait()
  if orphaned.is_set():
    os.killpg(0, signal.SIGKILL)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  os.killpg(0, signal.SIGTERM)  # what argv left behind
  return code if code >= 0 else 128 - code


if __name__ == "__main__":
  sys.exit(_main(sys.argv[1:]))
