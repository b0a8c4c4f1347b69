"""Runs one test in a pytest process of its own, for the few whose programs peak at
several GiB: the suite's process never holds them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_OWN_PROCESS = "RLVR_TEST_OWN_PROCESS"
_SHARED = "RLVR_TEST_SHARED_DIRS"
# Session fixtures whose first value is a directory the suite's process already built: the
# own process reuses it instead of building it again.
SHAREABLE = ("arithmetic_policy",)


def shared(name: str) -> str | None:
  """Inside an own process: the directory the suite built for fixture `name`, else None."""
  return json.loads(os.environ.get(_SHARED, "{}")).get(name)


def run_in_own_process(request) -> bool:
  """Runs the calling test in a fresh pytest process of its own and returns True once it
  passed there (the caller then returns); returns False inside that process, which runs the
  body. For the few tests whose programs peak at several GiB: the suite's process never
  holds them."""
  nodeid = request.node.nodeid
  if os.environ.get(_OWN_PROCESS) == nodeid:
    return False
  dirs = {n: request.getfixturevalue(n)[0] for n in SHAREABLE if n in request.fixturenames}
  proc = subprocess.run(
    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", nodeid],
    cwd=str(request.config.rootpath),
    env=dict(os.environ, **{_OWN_PROCESS: nodeid, _SHARED: json.dumps(dirs)}),
    capture_output=True,
    text=True,
  )
  assert proc.returncode == 0, (
    f"{nodeid} in its own process:\n{proc.stdout[-6000:]}{proc.stderr[-3000:]}"
  )
  return True
