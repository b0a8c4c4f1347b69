"""Child processes end with the process that started them, however it dies (kill -9 here):
a vLLM server from `start_server` (its engine processes too), the reward pool's workers, the
code sandbox's judges and the programs they run. A server started as a standalone process
(`launch.serve_vllm`) outlives the process that launched it."""

from __future__ import annotations

import collections
import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import paths
import pytest

REPO = pathlib.Path(paths.REPO)
GONE_S = 10.0  # every child of a killed parent is gone by then

# The parent that gets killed: starts children as a run does, prints one JSON line, waits.
PARENT = textwrap.dedent(
  r"""
  import json, os, sys, threading, time

  MARKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "judging")

  def slow_judge(pred, gold, integer_answers, timeout_s):
    open(MARKER, "w").close()
    time.sleep(3600)

  def rewards():
    from rlvr.rewards import RewardPool
    from rlvr.rewards import code

    pool = RewardPool(workers=1, timeout_s=3600, judge=slow_judge)
    threading.Thread(target=pool.score, args=([r"\boxed{x+y}"], ["1/2"]), daemon=True).start()
    limits = code.CodeLimits(cpu_s=1, wall_s=600)
    tests = {"inputs": [""], "outputs": [""]}
    for sandbox in ("bwrap", "none"):  # from threads, as `code.score` runs them
      threading.Thread(
        target=code.run_tests,
        args=("import time; time.sleep(3600)", tests, limits),
        kwargs={"sandbox": sandbox},
        daemon=True,
      ).start()
    print(json.dumps({"marker": MARKER}), flush=True)

  def server(model_dir):
    from rlvr.sampling.vllm_server import ServerOptions, start_server

    server = start_server(model_dir, ServerOptions(max_model_len=256))
    print(json.dumps({"url": server.url, "startup_s": server.startup_s}), flush=True)

  if __name__ == "__main__":
    {"rewards": rewards, "server": server}[sys.argv[1]](*sys.argv[2:])
    time.sleep(3600)
  """
)

# A stand-in for the vLLM environment's Python: serves /health on --port.
FAKE_SERVER = textwrap.dedent(
  """
  import http.server, sys

  class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
      self.send_response(200)
      self.end_headers()

    def log_message(self, *args):
      pass

  port = int(sys.argv[sys.argv.index("--port") + 1])
  http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
  """
)


def _stat(pid: int) -> tuple[str, int, str] | None:
  """(state, parent pid, start time) of a process, None when there is none."""
  try:
    text = pathlib.Path(f"/proc/{pid}/stat").read_text()
  except OSError:
    return None
  fields = text.rsplit(")", 1)[1].split()
  return fields[0], int(fields[1]), fields[19]


def _show(argv: bytes) -> str:
  return argv.rstrip(b"\0").replace(b"\0", b" ")[:120].decode(errors="replace")


def _cmdline(pid: int) -> bytes:
  try:
    return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
  except OSError:
    return b""


def _descendants(root: int) -> dict[tuple[int, str], bytes]:
  """{(pid, start time): argv} of every process below `root`."""
  children = collections.defaultdict(list)
  for entry in os.listdir("/proc"):
    if entry.isdigit() and (st := _stat(int(entry))) is not None:
      children[st[1]].append((int(entry), st[2]))
  found, todo = {}, [root]
  while todo:
    for pid, start in children.get(todo.pop(), []):
      found[(pid, start)] = _cmdline(pid)
      todo.append(pid)
  return found


def _alive(proc: tuple[int, str]) -> bool:
  st = _stat(proc[0])
  return st is not None and st[0] != "Z" and st[2] == proc[1]


def _kill(procs) -> None:
  for proc in procs:
    if _alive(proc):
      os.kill(proc[0], signal.SIGKILL)


def _start(tmp_path, *args, cmd=None) -> subprocess.Popen:
  """The parent process (PARENT, or `cmd`), its stderr in tmp_path/parent.log."""
  script = tmp_path / "parent.py"
  script.write_text(PARENT)
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  with open(tmp_path / "parent.log", "w") as log:
    return subprocess.Popen(
      cmd or [sys.executable, str(script), *args],
      cwd=REPO,
      env=env,
      stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE,
      stderr=log,
    )


def _line(proc: subprocess.Popen, tmp_path, timeout_s: float) -> str:
  """The parent's next line of stdout."""
  ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
  line = proc.stdout.readline().decode() if ready else ""
  assert line, f"no line from the parent (exit {proc.poll()}):\n{_log(tmp_path)}"
  return line


def _log(tmp_path) -> str:
  return (tmp_path / "parent.log").read_text()[-3000:]


def _kill_parent(proc: subprocess.Popen, procs: dict) -> list[str]:
  """kill -9 of the parent; the argv of its children still alive after GONE_S."""
  proc.kill()
  proc.wait()
  t0 = time.monotonic()
  while any(map(_alive, procs)) and time.monotonic() < t0 + GONE_S:
    time.sleep(0.1)
  print(f"\n{len(procs)} children of a killed parent: gone after {time.monotonic() - t0:.1f}s")
  return [f"{p[0]}: {_show(argv)}" for p, argv in procs.items() if _alive(p)]


def _answers(url: str) -> bool:
  try:
    with urllib.request.urlopen(url + "/health", timeout=2) as r:
      return r.status == 200
  except OSError:
    return False


def _is_judge(argv: bytes) -> bool:
  """A code judge or a program it runs (bubblewrap's own argv holds the judge's source too)."""
  return b"The judge inside the sandbox" in argv and b"python" in argv.split(b"\0")[0]


def test_reward_workers_and_sandboxes_die_with_their_parent(tmp_path):
  """A reward-pool worker in the middle of an item, and two programs sleeping in code
  judges (bubblewrap, and sandbox="none") started from threads: kill -9 of their parent
  ends every one of them (forkserver, bwrap, judges, programs)."""
  proc = _start(tmp_path, "rewards")
  procs = {}
  try:
    marker = json.loads(_line(proc, tmp_path, 120))["marker"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
      procs = _descendants(proc.pid)
      programs = [  # a judge's fork
        p
        for p, argv in procs.items()
        if _is_judge(argv) and (st := _stat(p[0])) and _is_judge(_cmdline(st[1]))
      ]
      if os.path.exists(marker) and len(programs) == 2:
        break
      time.sleep(0.2)
    else:
      running = "\n".join(f"{p[0]}: {_show(argv)}" for p, argv in procs.items())
      pytest.fail(f"the reward item and two programs never ran:\n{running}\n{_log(tmp_path)}")
    survivors = _kill_parent(proc, procs)
    assert not survivors, f"alive {GONE_S:.0f}s after their parent's kill -9:\n" + "\n".join(
      survivors
    )
  finally:
    proc.kill()
    proc.wait()
    _kill(procs)


@pytest.mark.slow
def test_vllm_server_dies_with_its_parent(tmp_path, served_model_dir):
  """A real vLLM server started by `start_server` in a process killed with kill -9: the server
  and every process under it (vLLM's engine) end, and its port stops answering."""
  t0 = time.time()
  proc = _start(tmp_path, "server", served_model_dir)
  procs = {}
  try:
    up = json.loads(_line(proc, tmp_path, 600))
    procs = _descendants(proc.pid)
    print(f"\nvLLM server up after {up['startup_s']:.0f}s, {len(procs)} processes")
    assert _answers(up["url"]) and len(procs) >= 2, procs  # the server and its engine
    survivors = _kill_parent(proc, procs)
    assert not survivors, f"alive {GONE_S:.0f}s after their parent's kill -9:\n" + "\n".join(
      survivors
    )
    assert not _answers(up["url"])
    print(f"test took {time.time() - t0:.0f}s")
  finally:
    proc.kill()
    proc.wait()
    _kill(procs)


def test_standalone_server_outlives_its_launcher(tmp_path):
  """`launch.serve_vllm` (a stand-in for vLLM's Python) killed with kill -9: the server it
  started keeps answering."""
  fake = tmp_path / "python"
  (tmp_path / "fake_server.py").write_text(FAKE_SERVER)
  fake.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "fake_server.py"} "$@"\n')
  fake.chmod(0o755)
  cmd = [sys.executable, "-m", "launch.serve_vllm", f"--model={tmp_path}", "--port=0"]
  proc = _start(tmp_path, cmd=[*cmd, f"--python={fake}"])
  procs = {}
  try:
    url = _line(proc, tmp_path, 120).split(" at ")[1].split()[0]
    procs = _descendants(proc.pid)
    assert procs and _answers(url), procs
    proc.kill()
    proc.wait()
    time.sleep(2.0)
    assert all(map(_alive, procs)) and _answers(url), procs
  finally:
    proc.kill()
    proc.wait()
    _kill(procs)
