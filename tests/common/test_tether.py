"""The tether (`rlvr.common.tether`) and `VLLMServer.stop()` with a plain long-running program
(`sleep`) standing in for the served process: whatever ends first (the starting process, the
tether, the program), nothing of the program's process group stays behind, and `stop()` keeps
no file descriptor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from test_parent_death import REPO, _alive, _descendants, _kill, _line, _show, _stat

from rlvr.common import tether
from rlvr.sampling.vllm_server import ServerOptions, VLLMServer

GONE_S = 3.0  # a process sent SIGTERM (or SIGKILL) is gone by then

# A trainer that starts a tethered `sleep`, then forks a child that never execs (as a reward
# function or a library may): the child holds whatever the trainer held when it forked.
TRAINER = textwrap.dedent(
  """
  import json, os, time
  from rlvr.common import tether

  proc = tether.start(["sleep", "600"])
  pid = os.fork()
  if pid == 0:
    time.sleep(600)
    os._exit(0)
  print(json.dumps({"tether": proc.pid, "fork": pid}), flush=True)
  time.sleep(600)
  """
)


def _server(proc: subprocess.Popen) -> VLLMServer:
  return VLLMServer("http://127.0.0.1:0", "", ServerOptions(), proc, "", 0.0)


def _with_sleep(root: int) -> dict:
  """{(pid, start time): argv} of `root` and every process below it, once `sleep` runs there."""
  deadline = time.monotonic() + 30
  while time.monotonic() < deadline:
    procs = _descendants(root)
    if any(argv.startswith(b"sleep\0") for argv in procs.values()):
      return {(root, _stat(root)[2]): b"tether", **procs}
    time.sleep(0.05)
  pytest.fail(f"no sleep under {root}: {procs}")


def _survivors(procs: dict, wait_s: float = GONE_S) -> list[str]:
  deadline = time.monotonic() + wait_s
  while any(map(_alive, procs)) and time.monotonic() < deadline:
    time.sleep(0.05)
  return [f"{p[0]}: {_show(argv)}" for p, argv in procs.items() if _alive(p)]


def test_forked_child_does_not_keep_the_tether(tmp_path):
  """A trainer killed with kill -9 while a child it forked (no exec) lives on: the tethered
  process and its tether end within seconds."""
  script = tmp_path / "trainer.py"
  script.write_text(TRAINER)
  env = dict(os.environ, PYTHONPATH=str(REPO))
  with open(tmp_path / "parent.log", "w") as log:
    trainer = subprocess.Popen(
      [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=log
    )
  procs, fork = {}, None
  try:
    pids = json.loads(_line(trainer, tmp_path, 60))
    fork = (pids["fork"], _stat(pids["fork"])[2])
    procs = _with_sleep(pids["tether"])
    trainer.kill()
    trainer.wait()
    survivors = _survivors(procs)
    assert not survivors, f"alive {GONE_S:.0f}s after the trainer's kill -9:\n" + "\n".join(
      survivors
    )
    assert _alive(fork)
  finally:
    trainer.kill()
    trainer.wait()
    _kill([*procs, *([fork] if fork else [])])


def test_stop_ends_the_group_of_a_killed_tether():
  """The tether killed with kill -9: `stop()` still ends the process it tethered."""
  proc = tether.start(["sleep", "600"])
  procs = _with_sleep(proc.pid)
  try:
    proc.kill()
    proc.wait()
    _server(proc).stop(timeout=GONE_S)
    survivors = _survivors(procs, 0.0)
    assert not survivors, "alive after stop():\n" + "\n".join(survivors)
  finally:
    _kill(procs)


def test_what_ignores_sigterm_ends_after_the_grace_period():
  """A process left behind by the tethered program, ignoring SIGTERM: it ends (SIGKILL) within
  `tether.GRACE_S` of the program's own end."""
  program = ["sh", "-c", "trap '' TERM; sleep 600 & echo $!"]
  proc = tether.start(program, stdout=subprocess.PIPE)
  left = ()
  try:
    pid = int(proc.stdout.readline())
    left = ((pid, _stat(pid)[2]),)
    proc.wait(tether.GRACE_S + GONE_S)
    survivors = _survivors({left[0]: b"sleep 600 (ignores SIGTERM)"})
    assert not survivors, (
      f"alive {GONE_S:.0f}s after its tether exited ({proc.returncode}):\n" + "\n".join(survivors)
    )
  finally:
    proc.kill()
    proc.wait()
    proc.stdout.close()
    _kill(left)


def _fds() -> list[str]:
  """What this process's file descriptors refer to."""
  links = []
  for fd in os.listdir("/proc/self/fd"):
    try:
      links.append(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:  # the listing's own
      pass
  return sorted(links)


def test_stop_keeps_no_descriptor():
  """`stop()` of servers that ended on their own, and of servers still running: while the
  stopped servers are still held, this process holds as many file descriptors as before."""
  before = _fds()
  servers = []
  for program in (["true"], ["sleep", "600"]):
    for _ in range(4):
      servers.append(_server(tether.start(program)))
      if program == ["true"]:
        servers[-1].process.wait(30)
      servers[-1].stop(timeout=GONE_S)
  after = _fds()
  assert after == before, f"{len(after) - len(before)} more: {after}"


def test_stop_ends_a_program_that_ignores_sigterm():
  """The tethered program ignores SIGTERM: `stop(timeout)` ends it with SIGKILL."""
  proc = tether.start(["sh", "-c", "trap '' TERM; sleep 600"])
  procs = _with_sleep(proc.pid)
  try:
    t0 = time.monotonic()
    _server(proc).stop(timeout=1.0)
    assert time.monotonic() - t0 < 1.0 + GONE_S
    survivors = _survivors(procs, 0.0)
    assert not survivors, "alive after stop():\n" + "\n".join(survivors)
  finally:
    _kill(procs)
