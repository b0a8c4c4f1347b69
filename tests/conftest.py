"""Session fixtures: tiny HF models built once, one real vLLM CPU server per session."""

from __future__ import annotations

import ast
import atexit
import ctypes
import ctypes.util
import gc
import glob
import json
import os
import resource
import shutil
import sys
import tempfile

import pytest
import sft_policy
import tiny_run

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Quick compiles (tiny_run.QUICK_COMPILE) for the pytest processes, unless the caller's
# XLA_FLAGS already say; the runs the tests start through tiny_run compile as a user's do.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {tiny_run.QUICK_COMPILE}".strip()

import jax  # noqa: E402

# 8 fake CPU devices for sharding tests; single-device code runs on device 0.
jax.config.update("jax_num_cpu_devices", 8)

# One persistent XLA compilation cache per pytest run, in a folder that run owns: this
# process, the other xdist worker and every subprocess the tests start (launch.* runs)
# load a program any of them compiled instead of compiling it again (a new Learner's step
# is a new function to JAX's in-memory cache but the same program to this one). Every
# program is cached, however quick its compile. No test relies on it: a test that compares
# two runs still runs both. The first process to load this file (xdist's controller) makes
# the folder; the workers and subprocesses inherit it.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="rlvr-tests-xla-cache-")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

# ---------------------------------------------------------------------------
# Memory: one pytest process runs every module, so what a module compiled or allocated
# is released when it ends, and the session ends with the figures for the README.

_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_MODULE_RSS: list[tuple[float, float, str]] = []  # (RSS after, peak so far, module) in GiB
_TEST_PEAKS: list[tuple[float, float, str]] = []  # (peak rise, peak after, test) in GiB
_GIB = float(1 << 30)
_TESTS = os.path.dirname(os.path.abspath(__file__))
# Test modules import shared pieces from one another by module name (unique across folders).
sys.path.extend(sorted(glob.glob(os.path.join(_TESTS, "*", ""))))


def _rss_gib() -> float:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / _GIB


def _peak_gib(who: int = resource.RUSAGE_SELF) -> float:
  return resource.getrusage(who).ru_maxrss * 1024 / _GIB  # Linux reports KiB


@pytest.fixture(autouse=True)
def _record_peak(request):
  """The tests that raised this process's peak RSS, and by how much."""
  before = _peak_gib()
  yield
  after = _peak_gib()
  if after > before + 0.05:
    _TEST_PEAKS.append((after - before, after, request.node.nodeid))


@pytest.fixture(scope="module", autouse=True)
def _release_module_memory(request):
  """After each module (and its module fixtures): drop JAX's compiled programs and traces,
  collect, and hand freed heap back to the OS (glibc keeps it otherwise)."""
  yield
  jax.clear_caches()
  gc.collect()
  _LIBC.malloc_trim(0)
  _MODULE_RSS.append((_rss_gib(), _peak_gib(), request.module.__name__))


def _memory_figures() -> dict:
  """This process's memory figures: its peak RSS, its largest child's, each module's."""
  return {
    "peak": _peak_gib(),
    "children": _peak_gib(resource.RUSAGE_CHILDREN),
    "modules": _MODULE_RSS,
    "tests": sorted(_TEST_PEAKS, reverse=True)[:5],
  }


def pytest_sessionfinish(session):
  workeroutput = getattr(session.config, "workeroutput", None)
  if workeroutput is not None:  # a pytest-xdist worker: its figures go to the controller
    workeroutput["rlvr_memory"] = json.dumps(_memory_figures())


_WORKERS: dict[str, dict] = {}  # pytest-xdist: worker id -> its memory figures


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
  figures = getattr(node, "workeroutput", {}).get("rlvr_memory")
  if figures:
    _WORKERS[node.gateway.id] = json.loads(figures)


def _fixture_scope(node: ast.FunctionDef) -> tuple[str, bool] | None:
  """(scope, autouse) of a `@pytest.fixture(...)` function, None for any other function."""
  for dec in node.decorator_list:
    call = dec if isinstance(dec, ast.Call) else None
    name = ast.unparse(call.func if call else dec)
    if name in ("pytest.fixture", "fixture"):
      kw = {k.arg: k.value for k in call.keywords} if call else {}
      scope = kw["scope"].value if isinstance(kw.get("scope"), ast.Constant) else "function"
      autouse = isinstance(kw.get("autouse"), ast.Constant) and kw["autouse"].value is True
      return scope, autouse
  return None


def _module_units(tree: ast.Module) -> dict[str, str] | None:
  """{test name: its unit within the module}: tests that share a module-scoped fixture of
  their module (directly or through its other fixtures) are one unit, named after the
  first of those fixtures; the module's other tests are the unit "". None when a
  module-scoped fixture is autouse (the whole module is one unit)."""
  fixtures, tests = {}, {}
  for node in ast.walk(tree):
    if isinstance(node, ast.FunctionDef):
      args = [a.arg for a in node.args.args]
      found = _fixture_scope(node)
      if found is not None:
        fixtures[node.name] = (found, args)
      elif node.name.startswith("test_"):
        tests[node.name] = args
  shared = {n for n, ((scope, _), _) in fixtures.items() if scope in ("module", "class")}
  if any(fixtures[n][0][1] for n in shared):
    return None

  def reach(names, seen):
    for n in names:
      if n in fixtures and n not in seen:
        seen.add(n)
        reach(fixtures[n][1], seen)
    return seen

  groups: list[set[str]] = []  # sets of shared fixtures, merged when a test takes two
  units = {}
  for test, args in tests.items():
    mine = reach(args, set()) & shared
    for g in [g for g in groups if g & mine]:
      groups.remove(g)
      mine |= g
    if mine:
      groups.append(mine)
    units[test] = mine
  return {t: min(next(g for g in groups if g >= m)) if m else "" for t, m in units.items()}


def _suite_units() -> tuple[dict[str, set[str] | None], dict[str, dict[str, str] | None]]:
  """({module: the names of its tests that take the session's one vLLM server, or None when
  one of its fixtures takes it (then every test of the module goes with the server)},
  {module: its tests' units (`_module_units`)})."""
  users, units = {}, {}
  for path in glob.glob(os.path.join(_TESTS, "**", "test_*.py"), recursive=True):
    module = os.path.relpath(path, os.path.dirname(_TESTS))
    tree = ast.parse(open(path).read())
    tests, whole = set(), False
    for node in ast.walk(tree):
      if isinstance(node, ast.FunctionDef) and "vllm_server" in [a.arg for a in node.args.args]:
        whole |= not node.name.startswith("test_")
        tests.add(node.name)
    if tests:
      users[module] = None if whole else tests
    units[module] = _module_units(tree)
  return users, units


_SERVER_USERS, _UNITS = _suite_units()


def _scope(nodeid: str) -> str:
  """The unit of work a pytest-xdist worker takes whole: "vllm" for a test that takes the
  session's server (or whose module's fixtures do); else the tests of its module that share
  its module-scoped fixtures (built once), or the module's tests that share none."""
  module, _, rest = nodeid.partition("::")
  name = rest.split("::")[-1].split("[")[0]
  tests = _SERVER_USERS.get(module, ())
  if tests is None or name in tests:
    return "vllm"
  units = _UNITS.get(module)
  unit = units.get(name, "") if units else ""
  return f"{module}::{unit}" if unit else module


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  """pytest-xdist (`-n 2`, the README's test command): each module runs whole on one worker,
  so its module fixtures are built once, except its tests that take the vLLM server: those
  of every module run on one worker in file order, as they would in one process (one
  server, its weights pushed in the order the tests expect). Units go out in collection
  order (pytest_collection_modifyitems puts the longest first)."""
  from xdist.scheduler import LoadScopeScheduling

  config.option.loadscopereorder = False

  class ByModule(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
      return _scope(nodeid)

  return ByModule(config, log)


# The fast tier, `pytest -m "not slow"`: every layer's unit tests, without the tests marked
# slow in their modules, those listed in tests/slow_tests.txt (measured over 6 s) and those
# that take a vLLM server or the SFT'd policy (a server start, an SFT run).
_SLOW_FIXTURES = {"vllm_server", "keyed_server", "lora_server", "arithmetic_policy"}


def _slow_tests() -> dict[str, float]:
  """{module::test: seconds measured} from tests/slow_tests.txt."""
  with open(os.path.join(_TESTS, "slow_tests.txt")) as f:
    rows = [line.split() for line in f if line.strip() and not line.startswith("#")]
  return {row[0]: float(row[1]) for row in rows}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marks added here
def pytest_collection_modifyitems(config, items):
  listed, names = _slow_tests(), set()
  for item in items:
    name = f"{os.path.relpath(str(item.path), _TESTS)}::{item.originalname}"
    names.add(name)
    if name in listed or _SLOW_FIXTURES & set(item.fixturenames):
      item.add_marker(pytest.mark.slow)
  _order(items, listed)
  if config.option.keyword or any("::" in a for a in config.args):
    return  # some tests of a module are not collected: no telling a stale name
  modules = {n.split("::")[0] for n in names}
  stale = sorted(n for n in set(listed) - names if n.split("::")[0] in modules)
  if stale:
    raise pytest.UsageError(f"tests/slow_tests.txt names tests that do not exist: {stale}")


def _order(items, seconds: dict[str, float]) -> None:
  """The server's tests first, in the order of their modules' file names whatever the
  folder (they push weights in that order), then the other units (`_scope`) by the seconds
  their slow tests took (tests/slow_tests.txt), longest first, so that no long unit starts
  last and keeps one worker busy alone."""
  cost: dict[str, float] = {}
  for name, s in seconds.items():
    unit = _scope("tests/" + name)
    cost[unit] = cost.get(unit, 0.0) + s

  def key(item):
    unit = _scope(item.nodeid)
    if unit == "vllm":
      return (False, 0.0, os.path.basename(item.nodeid.split("::")[0]))
    return (True, -cost.get(unit, 0.0), unit)

  items.sort(key=key)


# module -> {worker: seconds}: where the suite's time goes
_MODULE_SECONDS: dict[str, dict[str, float]] = {}


def pytest_runtest_logreport(report):
  by_worker = _MODULE_SECONDS.setdefault(report.nodeid.split("::")[0], {})
  worker = getattr(report, "node", None) and report.node.gateway.id or ""
  by_worker[worker] = by_worker.get(worker, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
  tr = terminalreporter
  if _MODULE_SECONDS:
    tr.section("time by module (setup, call and teardown)")
    by_worker: dict[str, float] = {}
    for workers in _MODULE_SECONDS.values():
      for w, seconds in workers.items():
        by_worker[w] = by_worker.get(w, 0.0) + seconds
    tr.write_line(
      ", ".join(f"{w or 'pytest'} {s / 60:.1f} min" for w, s in sorted(by_worker.items()))
    )
    ranked = sorted(_MODULE_SECONDS.items(), key=lambda kv: -sum(kv[1].values()))
    for module, workers in ranked[:20]:
      where = ", ".join(f"{w} {s:.0f} s" for w, s in sorted(workers.items()) if w)
      tr.write_line(
        f"  {sum(workers.values()):7.1f} s  {module}" + (f" ({where})" if where else "")
      )
  processes = _WORKERS or ({"pytest": _memory_figures()} if _MODULE_RSS else {})
  if not processes:
    return
  tr.section("memory")
  grew = []
  for name, fig in sorted(processes.items()):
    tr.write_line(
      f"{name} process: peak RSS {fig['peak']:.2f} GiB; largest child process (vLLM server, "
      f"launch.* runs, sandboxes) {fig['children']:.2f} GiB"
    )
    last = 0.0
    for rss, peak, module in fig["modules"]:
      grew.append((peak - last, rss, peak, module, name))
      last = peak
  for step, rss, peak, module, name in sorted(grew, reverse=True)[:5]:
    if step > 0:
      tr.write_line(
        f"  {module} ({name}): peak {peak:.2f} GiB (+{step:.2f}), {rss:.2f} GiB after it"
      )
  tests = sorted((t for fig in processes.values() for t in fig["tests"]), reverse=True)[:5]
  if tests:
    tr.write_line("tests that raised a process's peak most:")
  for step, peak, nodeid in tests:
    tr.write_line(f"  {nodeid}: +{step:.2f} GiB, to {peak:.2f} GiB")


LLAMA3_SCALING = dict(
  factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64
)
# Three families, sized so every code path runs (GQA, tied/untied, rope scaling).
TINY_FAMILIES = {
  "qwen2": dict(family="qwen2", tie_word_embeddings=True),
  "qwen3": dict(
    family="qwen3",
    tie_word_embeddings=False,
    num_heads=4,
    num_kv_heads=1,
    head_dim=64,
    rope_theta=1e6,
  ),
  "llama": dict(
    family="llama",
    tie_word_embeddings=False,
    rope_theta=500000.0,
    rope_scaling=LLAMA3_SCALING,
    num_layers=3,
  ),
}


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
  """{family: HF dir} of random tiny models (init std 0.1 for peaked distributions)."""
  from rlvr import model

  root = tmp_path_factory.mktemp("tiny")
  return {
    name: model.make_tiny(str(root / name), seed=i, init_std=0.1, **kw)
    for i, (name, kw) in enumerate(TINY_FAMILIES.items())
  }


@pytest.fixture(scope="session")
def served_model_dir(tmp_path_factory, tiny_dirs):
  """A model written by `save_hf` (with tokenizer), which the vLLM server serves.

  Written untied (explicit lm_head.weight): the sampler tests reload weights in
  place, which vLLM does not propagate to a tied LM head."""
  import jax
  from transformers import AutoTokenizer

  from rlvr import model

  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  # Move away from the factory's weights so the served copy is save_hf's own.
  params = jax.tree.map(lambda p: p * 1.1, params)
  out = str(tmp_path_factory.mktemp("served") / "policy")
  model.save_hf(
    out,
    cfg,
    params,
    tokenizer=AutoTokenizer.from_pretrained(tiny_dirs["qwen2"]),
    untie_embeddings=True,
  )
  return out


@pytest.fixture(scope="session")
def vllm_server(served_model_dir):
  """One real vLLM CPU server for the whole session (never skipped: CI installs it), with
  the `rlvr_tcp` weight-transfer engine on, so disk and transfer syncs reach the same one."""
  from rlvr.sampling.vllm_server import ServerOptions, start_server

  server = start_server(
    served_model_dir, ServerOptions(max_model_len=1024, weight_transfer="rlvr_tcp")
  )
  print(f"\nvLLM server up at {server.url} after {server.startup_s:.1f}s")
  yield server
  server.stop()


@pytest.fixture(scope="session")
def one_device_learner():
  """(model config, params, learning rate, rl=RLConfig() (the step's shapes and seed),
  pad_id=0, **LearnerConfig fields) -> a `learner.Learner` on one CPU device (its `state`,
  `update_fn`, `to_batch`)."""
  from rlvr import learner, rollout
  from rlvr.parallel import sharding

  def make(cfg, params, lr, *, rl=None, pad_id=0, **learner_fields):
    mesh = sharding.make_mesh({"fsdp": 1}, jax.devices()[:1])
    lc = learner.LearnerConfig(learning_rate=lr, **learner_fields)
    rl = rl if rl is not None else rollout.RLConfig()
    return learner.Learner(
      learner.init_state(cfg, lc, params, mesh),
      learner.make_update_fn(cfg, lc, mesh),
      lambda a: learner.TrainBatch(**{k: jax.device_put(v) for k, v in a.items()}),
      lc,
      rl.batch_shape,
      rl.seed,
      pad_id,
      learner.make_logprob_fn(cfg, lc, mesh),
    )

  return make


def built_once(tmp_path_factory, name: str, build) -> str:
  """`build(dir)` run once per session whichever pytest-xdist worker asks first; the others
  wait for it and get the same dir (the workers' temporary dirs share a parent)."""
  import fcntl

  if "PYTEST_XDIST_WORKER" not in os.environ:  # one process: nothing to share
    return build(str(tmp_path_factory.mktemp(name)))
  root = tmp_path_factory.getbasetemp().parent
  done = root / f"{name}.done"
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if not done.exists():
      out = root / name
      shutil.rmtree(out, ignore_errors=True)
      out.mkdir()
      done.write_text(build(str(out)))
    return done.read_text()


@pytest.fixture(scope="session")
def arithmetic_policy(tiny_dirs, tmp_path_factory):
  """The test qwen2 model after 300 SFT steps on 300 worked solutions plus their
  inverse pairs (`sft_policy`, in a child process): it solves some problems,
  so some are underperforming, and turns solutions back into problems, so the
  step sees synthesis and synthetic-solving groups. Same architecture and
  tokenizer as the served model: the vLLM test pushes these weights. Trained once per
  session (`built_once`): four modules take it, on either worker."""
  from rlvr.data.tasks import arithmetic

  train, _ = arithmetic.make_splits(300 + 64, 0, max_operand=9)
  out = built_once(
    tmp_path_factory,
    "svs_sft",
    lambda d: sft_policy.train(tiny_dirs["qwen2"], d, "arithmetic"),
  )
  return out, train[300:]


@pytest.fixture(scope="session")
def arithmetic_score():
  """The real math-verify scorer with integer answers: (texts, golds, prompts=None) ->
  (rewards, correct)."""
  from rlvr.rewards import RewardConfig, RewardPool

  with RewardPool(workers=1) as pool:
    rc = RewardConfig(integer_answers=True)

    def fn(texts, golds, prompts=None):
      res = pool.score(texts, golds, rc)
      return res.rewards, res.correct

    yield fn


def _check_samples(path, result):
  """The samples file `evaluate_set` wrote beside `result` holds n responses per problem
  and seed, and per seed the correct counts the result reports."""
  with open(path) as f:
    rows = [json.loads(line) for line in f]
  assert len(rows) == result["problems"] * len(result["seeds"]), (path, len(rows))
  assert all(len(r["responses"]) == result["n"] for r in rows), path
  for s in result["per_seed"]:
    mine = [sum(x["correct"] for x in r["responses"]) for r in rows if r["seed"] == s["seed"]]
    assert mine == s["correct_counts"], (path, s["seed"], mine, s["correct_counts"])
  return rows


@pytest.fixture(scope="session")
def check_samples():
  return _check_samples
