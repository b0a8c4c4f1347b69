"""The file writes every part of a run shares: atomic replacement, JSON and JSONL; the
work dir's lock; disk errors in one line.

A file written with `atomic_open` appears at its path only once the block that writes
it ends without an error (a temporary beside it, then `os.replace`), so a killed run,
or one whose disk is full, never leaves a half-written checkpoint index, report or
weight file behind; `atomic_dir` does the same for a whole folder (an HF export).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import socket
from typing import Any, Iterator, Mapping, Sequence


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", fsync: bool = False) -> Iterator[Any]:
  """A file open for writing that replaces `path` when the block ends without an error.

  fsync: the file's bytes reach the disk before it replaces `path` (and the rename after)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, mode) as f:
      yield f
      if fsync:
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException as e:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)
    if isinstance(e, OSError) and e.filename is None:  # a write or close: name the file
      raise OSError(e.errno, e.strerror, path) from e
    raise
  if fsync:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
      os.fsync(fd)
    finally:
      os.close(fd)


def write_json(path: str, obj: Any) -> None:
  with atomic_open(path) as f:
    json.dump(obj, f, indent=2)


def read_jsonl(path: str) -> list[dict]:
  """The rows of a JSONL file (blank lines skipped)."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path: str, rows: Sequence[Mapping[str, Any]]) -> None:
  """The whole file at once, atomically."""
  with atomic_open(path) as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")


# ------------------------------------------------------------------ work dir lock
LOCK = ".lock"


class WorkdirBusyError(RuntimeError):
  """Another process holds the work dir's lock: one line naming its pid and host."""


def _holder(path: str) -> str:
  try:
    with open(path) as f:
      who = json.loads(f.read() or "{}")
    return f"pid {who['pid']} on host {who['host']}"
  except (OSError, ValueError, KeyError, TypeError):
    return "another process"


@contextlib.contextmanager
def workdir_lock(workdir: str) -> Iterator[str]:
  """Holds an exclusive advisory lock (`flock`) on `workdir`/.lock for the block, which
  records this process's pid and host; raises `WorkdirBusyError` at once when another
  process holds it. The kernel releases the lock when its holder exits in any way
  (kill -9 included), so a lock file a dead run left behind is simply taken over.
  On NFS, Linux emulates flock with POSIX locks, which the server sees from every host."""
  path = os.path.join(workdir, LOCK)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise WorkdirBusyError(
        f"work dir {workdir} is in use by {_holder(path)} (lock {path}); wait for that run "
        "to end or stop it, or give another --workdir"
      ) from None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode() + b"\n")
    yield path
  finally:
    os.close(fd)  # closing the only descriptor releases the lock


# ------------------------------------------------------------------ disk errors
_DISK_ERRORS = {  # errno: (verb, what, what to do)
  errno.ENOSPC: ("write", "no space left on the device", "free space on that file system"),
  errno.EDQUOT: ("write", "disk quota exceeded", "free space within the quota"),
  errno.EROFS: ("write", "read-only file system", "remount it writable"),
  errno.EACCES: ("access", "permission denied", "make it writable for this user"),
  errno.EPERM: ("access", "operation not permitted", "make it writable for this user"),
}
_PERMISSIONS = (errno.EACCES, errno.EPERM)
# TensorStore (orbax's array writer) raises ValueError with the OS error code in its text.
_TENSORSTORE_CODE = re.compile(r"os_error_code='(\d+)'")
_TENSORSTORE_FILE = re.compile(r'local file "([^"]+)"')


def disk_error(e: BaseException, workdir: str | None = None) -> str | None:
  """One line for an error writing files (full disk, quota, read-only file system; and
  permissions under `workdir`), naming the path and what to do; None for any other error
  (a data file this user may not read keeps its own message)."""
  for err in _chain(e):
    code, where = None, None
    if isinstance(err, OSError) and err.errno in _DISK_ERRORS:
      code, where = err.errno, err.filename
    elif isinstance(err, ValueError) and (m := _TENSORSTORE_CODE.search(str(err))):
      code, path = int(m.group(1)), _TENSORSTORE_FILE.search(str(err))
      where = path.group(1) if path else None
    if code not in _DISK_ERRORS:
      continue
    where = re.sub(r"\.tmp\d+$", "", os.fsdecode(where)) if where is not None else None
    inside = workdir is not None and (
      where is None
      or os.path.abspath(where).startswith(os.path.abspath(workdir) + os.sep)
      or os.path.abspath(where) == os.path.abspath(workdir)
    )
    if code in _PERMISSIONS and not inside:
      return None
    verb, what, todo = _DISK_ERRORS[code]
    todo += ", or give another --workdir" if inside else ""
    name = where if where is not None else (workdir or "the work dir")
    return f"cannot {verb} {name}: {what} ({errno.errorcode[code]}); {todo}"
  return None


def _chain(e: BaseException | None) -> Iterator[BaseException]:
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    yield e
    e = e.__cause__ or e.__context__


# ------------------------------------------------------------------ whole folders
def replace_dir(src: str, dest: str) -> None:
  """Renames the folder `src` to `dest` in place of whatever `dest` held, which is renamed
  aside first and removed after: `dest` holds its old contents or `src`'s, never a mix."""
  aside = f"{dest}.old{os.getpid()}"
  if os.path.lexists(dest):
    os.rename(dest, aside)
  os.rename(src, dest)
  if os.path.isdir(aside) and not os.path.islink(aside):
    shutil.rmtree(aside)
  elif os.path.lexists(aside):
    os.remove(aside)


@contextlib.contextmanager
def atomic_dir(path: str, write: bool = True) -> Iterator[str]:
  """A folder to fill that replaces the folder `path` whole when the block ends without an
  error, as `atomic_open` replaces a file: the block writes into `path`.partial beside it
  (emptied first), which `replace_dir` then renames into place, so `path` never holds half
  a folder nor files of the one it replaces. The name is the same on every process of a
  multi-host run; write=False (a process that writes nothing) touches nothing on disk."""
  tmp = f"{os.path.abspath(path)}.partial"
  if not write:
    yield tmp
    return
  shutil.rmtree(tmp, ignore_errors=True)
  try:
    yield tmp
    replace_dir(tmp, os.path.abspath(path))
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
