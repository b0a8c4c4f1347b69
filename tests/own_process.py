"""Runs one test in a pytest process of its own, for the few whose programs peak at
several GiB: the suite's process never holds them."""

from __future__ import annotations

import os
import subprocess
import sys

_OWN_PROCESS = "RLVR_TEST_OWN_PROCESS"


def run_in_own_process(request) -> bool:
  """Runs the calling test in a fresh pytest process of its own and returns True once it
  passed there (the caller then returns); returns False inside that process, which runs the
  body. For the few tests whose programs peak at several GiB: the suite's process never
  holds them."""
  nodeid = request.node.nodeid
  if os.environ.get(_OWN_PROCESS) == nodeid:
    return False
  proc = subprocess.run(
    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", nodeid],
    cwd=str(request.config.rootpath),
    env=dict(os.environ, **{_OWN_PROCESS: nodeid}),
    capture_output=True,
    text=True,
  )
  assert proc.returncode == 0, (
    f"{nodeid} in its own process:\n{proc.stdout[-6000:]}{proc.stderr[-3000:]}"
  )
  return True
