"""One run per work dir, and disks that cannot be written.

The lock is an flock on <workdir>/.lock held by a real process; the kernel releases it
when that process dies (kill -9 included), so a later run takes it over. A full or
read-only work dir (real tmpfs mounts) stops a run with one line naming the path and
what to do, and leaves nothing half-written."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import tiny_run
from mounts import tmpfs
from paths import REPO

from rlvr.common import fileio

# A process that takes the lock through the library and holds it until its stdin closes.
HOLD = (
  "import sys\n"
  "from rlvr.common import fileio\n"
  "with fileio.workdir_lock(sys.argv[1]):\n"
  "  print('held', flush=True)\n"
  "  sys.stdin.read()\n"
)


@pytest.fixture
def holder():
  procs = []

  def start(workdir) -> subprocess.Popen:
    p = subprocess.Popen(
      [sys.executable, "-c", HOLD, str(workdir)],
      cwd=REPO,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      text=True,
    )
    procs.append(p)
    assert p.stdout.readline() == "held\n"
    return p

  yield start
  for p in procs:
    if p.poll() is None:
      p.kill()
    p.wait()


def _busy(workdir, pid) -> str:
  return (
    f"work dir {workdir} is in use by pid {pid} on host {socket.gethostname()} (lock "
    f"{workdir}/.lock); wait for that run to end or stop it, or give another --workdir"
  )


def test_a_held_lock_refuses_others_and_is_taken_over_after_kill_9(holder, tmp_path):
  p = holder(tmp_path)
  with pytest.raises(fileio.WorkdirBusyError) as e:
    with fileio.workdir_lock(str(tmp_path)):
      pass
  assert str(e.value) == _busy(tmp_path, p.pid)
  p.send_signal(signal.SIGKILL)
  assert p.wait() == -signal.SIGKILL
  # The dead holder's file is still there; its lock went with it.
  assert json.loads((tmp_path / ".lock").read_text())["pid"] == p.pid
  with fileio.workdir_lock(str(tmp_path)):
    assert json.loads((tmp_path / ".lock").read_text()) == {
      "pid": os.getpid(),
      "host": socket.gethostname(),
    }
  with fileio.workdir_lock(str(tmp_path)):  # released when the block ends
    pass


def _train(workdir, *flags):
  return tiny_run.launch(
    workdir, "--config.sft.steps=0", "--config.data.arithmetic.n_sft=0", *flags, timeout=600
  )


def _one_line(out) -> str:
  assert out.returncode == 1, out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  line = out.stderr.strip().splitlines()[-1]
  suffix = " (--verbose for the traceback)"
  assert line.startswith("launch.train: ") and line.endswith(suffix), line
  return line[len("launch.train: ") : -len(suffix)]


def test_launch_train_refuses_a_work_dir_another_run_holds(holder, tmp_path):
  p = holder(tmp_path)
  out = _train(tmp_path)
  assert _one_line(out) == _busy(tmp_path, p.pid)
  assert os.listdir(tmp_path) == [".lock"]  # stopped before writing anything


def test_launch_train_on_a_read_only_work_dir(tmp_path):
  with tmpfs(str(tmp_path / "ro"), "64k", read_only=True) as workdir:
    out = _train(workdir)
    assert _one_line(out) == (
      f"cannot write {workdir}/.lock: read-only file system (EROFS); remount it writable, "
      "or give another --workdir"
    )
    assert os.listdir(workdir) == []


def test_launch_train_on_a_full_work_dir(tmp_path):
  # One page: the lock's few bytes fill it, the run's first file (config.json) fails.
  with tmpfs(str(tmp_path / "full"), "4k") as workdir:
    out = _train(workdir)
    assert _one_line(out) == (
      f"cannot write {workdir}/config.json: no space left on the device (ENOSPC); free "
      "space on that file system, or give another --workdir"
    )
    assert os.listdir(workdir) == [".lock"]  # no config.json, no temporary beside it


def test_a_full_disk_keeps_the_previous_file_whole(tmp_path):
  with tmpfs(str(tmp_path / "full"), "8k") as root:
    path = os.path.join(root, "summary.json")
    fileio.write_json(path, {"steps": 1})
    with pytest.raises(OSError) as e:
      fileio.write_json(path, {"steps": 2, "pad": "x" * 16384})
    assert fileio.disk_error(e.value, root) == (
      f"cannot write {path}: no space left on the device (ENOSPC); free space on that file "
      "system, or give another --workdir"
    )
    with open(path) as f:
      assert json.load(f) == {"steps": 1}
    assert os.listdir(root) == ["summary.json"]


def test_permission_errors_outside_the_work_dir_keep_their_own_message(tmp_path):
  err = PermissionError(13, "Permission denied", "/data/train.jsonl")
  assert fileio.disk_error(err, str(tmp_path)) is None
  inside = PermissionError(13, "Permission denied", str(tmp_path / "metrics.jsonl"))
  assert fileio.disk_error(inside, str(tmp_path)) == (
    f"cannot access {tmp_path}/metrics.jsonl: permission denied (EACCES); make it writable "
    "for this user, or give another --workdir"
  )
