"""Small tmpfs mounts for the disk-error tests: a really full disk, a really read-only one.

Mounting needs root (or CAP_SYS_ADMIN); where it is not permitted the test is skipped
and says why. chmod does not stop root, so a read-only mount is how to get EROFS."""

from __future__ import annotations

import contextlib
import os
import subprocess

import pytest


@contextlib.contextmanager
def tmpfs(path: str, size: str, read_only: bool = False):
  """A tmpfs of `size` (e.g. "4k": one page) mounted at `path`, optionally read-only."""
  os.makedirs(path, exist_ok=True)
  out = subprocess.run(
    ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, text=True
  )
  if out.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here ({out.stderr.strip()}): needs root")
  try:
    if read_only:
      subprocess.run(["mount", "-o", "remount,ro", path], check=True, capture_output=True)
    yield path
  finally:
    subprocess.run(["umount", "-l", path], check=False, capture_output=True)
