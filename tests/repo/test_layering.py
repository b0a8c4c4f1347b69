"""The import structure of docs/architecture.md#layering, read from the source with `ast`:
no import cycle, each folder of rlvr/ importing only the folders below it, pure
`synthesis/`, a runner that knows methods only through `methods.make`, nothing
importing `launch/`, and one HTTP core for every server client."""

from __future__ import annotations

import ast
import os

import pytest
from paths import REPO

PACKAGES = ("rlvr", "synthesis", "launch", "configs")


def _modules() -> dict[str, str]:
  """Dotted module name -> file path for every .py file of our packages."""
  out = {}
  for pkg in PACKAGES:
    for root, _, files in os.walk(os.path.join(REPO, pkg)):
      for f in files:
        if f.endswith(".py"):
          rel = os.path.relpath(os.path.join(root, f), REPO)[:-3].replace(os.sep, ".")
          out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(
            root, f
          )
  return out


MODULES = _modules()


def _imports(path: str) -> set[str]:
  """Every module this file imports, at any depth (function-level imports included):
  `from a.b import c` counts as a.b.c when that is a module of ours, else as a.b."""
  found = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for a in node.names:
        sub = f"{node.module}.{a.name}"
        found.add(sub if sub in MODULES else node.module)
  return found


GRAPH = {name: _imports(path) for name, path in MODULES.items()}


def _ours(name: str) -> bool:
  return name.split(".")[0] in PACKAGES


def test_no_import_cycle():
  edges = {m: {d for d in deps if d in MODULES and d != m} for m, deps in GRAPH.items()}
  # A package's __init__ importing its own submodules is how packages work, not a cycle.
  edges = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in edges.items()}
  state, stack = {}, []

  def visit(m):
    state[m] = "open"
    stack.append(m)
    for d in sorted(edges[m]):
      if state.get(d) == "open":
        raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d) :] + [d]))
      if d not in state:
        visit(d)
    stack.pop()
    state[m] = "done"

  for m in sorted(edges):
    if m not in state:
      visit(m)


def _deps(prefix: str):
  return {
    (m, d) for m, deps in GRAPH.items() if m == prefix or m.startswith(prefix + ".") for d in deps
  }


def test_synthesis_is_pure():
  banned = (
    "jax",
    "flax",
    "optax",
    "orbax",
    "requests",
    "urllib",
    "http",
    "socket",
    "transformers",
    "rlvr",
    "launch",
    "configs",
  )
  bad = {(m, d) for m, d in _deps("synthesis") if d.split(".")[0] in banned}
  assert not bad, bad


# The folders of rlvr/ and what each may import (docs/architecture.md#layering): a folder
# imports itself and the folders listed, never one above it. `synthesis` is pure.
FOLDERS = {
  "rlvr.common": (),
  "rlvr.data": ("rlvr.common",),
  "rlvr.parallel": ("rlvr.common",),
  "rlvr.objectives": ("rlvr.common",),
  "rlvr.sandbox": (),
  "rlvr.rewards": ("rlvr.common", "rlvr.sandbox"),
  "rlvr.model": ("rlvr.common", "rlvr.parallel"),
  "rlvr.sampling": ("rlvr.common", "rlvr.model", "rlvr.parallel"),
  "rlvr.learner": ("rlvr.common", "rlvr.model", "rlvr.objectives", "rlvr.parallel"),
  "rlvr.envs": (
    "rlvr.common",
    "rlvr.data",
    "rlvr.parallel",
    "rlvr.rewards",
    "rlvr.sampling",
    "rlvr.sandbox",
  ),
  "rlvr.rollout": (
    "rlvr.common",
    "rlvr.data",
    "rlvr.envs",
    "rlvr.learner",
    "rlvr.model",
    "rlvr.objectives",
    "rlvr.parallel",
    "rlvr.rewards",
    "rlvr.sampling",
    "rlvr.sandbox",
  ),
  "rlvr.methods": (
    "rlvr.common",
    "rlvr.data",
    "rlvr.envs",
    "rlvr.model",
    "rlvr.objectives",
    "rlvr.parallel",
    "rlvr.rewards",
    "rlvr.rollout",
    "rlvr.sampling",
    "rlvr.sandbox",
    "synthesis",
  ),
  "rlvr.report": ("rlvr.common", "rlvr.envs"),
}


def _folder(module: str) -> str:
  return ".".join(module.split(".")[:2])


def test_every_folder_of_rlvr_has_its_place():
  """A new folder joins FOLDERS (and the picture) or rlvr.run, the top."""
  folders = {_folder(m) for m in MODULES if m.startswith("rlvr.") and m.count(".") >= 1}
  assert folders - set(FOLDERS) == {"rlvr.run"}, folders - set(FOLDERS)


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_a_folder_imports_only_the_folders_below_it(folder):
  allowed = (folder, *FOLDERS[folder])
  bad = {
    (m, d)
    for m, d in _deps(folder)
    if _ours(d) and d != "rlvr" and not any(d == a or d.startswith(a + ".") for a in allowed)
  }
  assert not bad, bad


@pytest.mark.parametrize(
  "layer,allowed",
  [
    (
      "rlvr.model",
      ("rlvr.model", "rlvr.parallel.sharding", "rlvr.common.fileio", "rlvr.common.chatml"),
    ),
    ("rlvr.data.chat_templates", ("rlvr.common.chatml",)),
    ("rlvr.common.fileio", ()),
    ("rlvr.parallel.sharding", ()),
    ("rlvr.sampling.http", ()),
    ("rlvr.sampling.config", ("rlvr.sampling.http",)),
    ("rlvr.model.hub", ()),
    (
      "rlvr.run.experiment",
      (
        "rlvr.data.datasets",
        "rlvr.run.evaluation",
        "rlvr.learner",
        "rlvr.rollout",
        "rlvr.common.settings",
        "rlvr.rewards.shaping",
        "rlvr.rewards",
        "rlvr.sampling.config",
        "rlvr.envs",
        "rlvr.common.named",
        "rlvr.methods",
        "rlvr.run.sections",
      ),
    ),
    ("rlvr.run.sections", ("rlvr.learner", "rlvr.run.evaluation")),
    ("rlvr.common.named", ()),
    ("rlvr.objectives", ("rlvr.objectives", "rlvr.common.named")),
    ("rlvr.model.lowp", ()),
    ("rlvr.learner.packing", ("rlvr.objectives",)),
    ("rlvr.learner.ppo", ("rlvr.objectives", "rlvr.learner", "rlvr.learner.packing")),
    (
      "rlvr.run.composition_build",
      ("rlvr.run.composition_plan", "rlvr.sampling.assistant", "synthesis"),
    ),
    ("rlvr.run.composition_plan", ("rlvr.data.readers", "synthesis")),
    ("rlvr.methods.qbq_store", ("rlvr.parallel.distributed", "rlvr.common.fileio", "synthesis")),
    ("rlvr.methods.qbq_teachers", ("rlvr.sampling.assistant", "rlvr.data.tasks", "synthesis")),
    ("rlvr.rewards", ("rlvr.rewards", "rlvr.common.named", "rlvr.sandbox")),
    ("rlvr.sandbox", ("rlvr.sandbox",)),
    ("rlvr.sandbox.driver", ()),
    ("rlvr.data.tasks.humaneval", ()),
  ],
)
def test_modules_import_no_more_than_they_need(layer, allowed):
  """Finer than the folders: modules that stay below most of their own folder's neighbours."""
  bad = {
    (m, d)
    for m, d in _deps(layer)
    if _ours(d) and d != "rlvr" and not any(d == a or d.startswith(a + ".") for a in allowed)
  }
  assert not bad, bad


def test_code_judge_is_standard_library_only():
  """The judge runs in the sandbox on the base interpreter: no venv, nothing of ours there."""
  import sys

  bad = {
    d for _, d in _deps("rlvr.sandbox.driver") if d.split(".")[0] not in sys.stdlib_module_names
  }
  assert not bad, bad


def test_nothing_imports_launch():
  bad = {
    (m, d)
    for m, deps in GRAPH.items()
    if not m.startswith("launch")
    for d in deps
    if d.split(".")[0] == "launch"
  }
  assert not bad, bad


def test_only_the_runner_and_configs_see_the_whole_experiment():
  """rlvr.run.experiment checks every section; the library below it never reads a whole config
  (the run's own wiring does: runner, trainer, outcome, workdir)."""
  bad = {
    m
    for m, deps in GRAPH.items()
    if "rlvr.run.experiment" in deps
    and m not in ("rlvr.run.runner", "rlvr.run.trainer", "rlvr.run.outcome", "rlvr.run.workdir")
    and not m.startswith(("configs", "launch"))
  }
  assert not bad, bad


def test_only_launch_runs_a_composition_build():
  build = ("rlvr.run.composition_build", "rlvr.run.composition_plan")
  bad = {
    m
    for m, deps in GRAPH.items()
    if set(build) & deps and m not in build and not m.startswith("launch")
  }
  assert not bad, bad


def test_one_http_core():
  """Making sessions, the auth header and the API key's variable: rlvr.sampling.http alone."""
  found = set()
  for name, path in MODULES.items():
    for node in ast.walk(ast.parse(open(path).read())):
      if (
        isinstance(node, ast.Constant)
        and node.value in ("Authorization", "VLLM_API_KEY")
        or isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "Session"
      ):
        found.add(name)
  assert found == {"rlvr.sampling.http"}, found


def test_runner_knows_no_task_synthesis_or_method():
  deps = GRAPH["rlvr.run.runner"]
  assert not {d for d in deps if d.startswith(("synthesis", "rlvr.data.tasks", "rlvr.methods."))}, (
    deps
  )
  # methods.make is the only reader of cfg.method
  readers = set()
  for name, path in MODULES.items():
    for node in ast.walk(ast.parse(open(path).read())):
      if (
        isinstance(node, ast.Attribute)
        and node.attr == "method"
        and isinstance(node.value, ast.Name)
        and node.value.id in ("cfg", "c", "config")
        and isinstance(node.ctx, ast.Load)
      ):
        readers.add(name)
  assert readers <= {"rlvr.methods", "configs.base"}, readers


def test_no_module_level_getattr():
  bad = [
    m
    for m, path in MODULES.items()
    if any(
      isinstance(n, ast.FunctionDef) and n.name == "__getattr__"
      for n in ast.parse(open(path).read()).body
    )
  ]
  assert not bad, bad


def test_no_method_hook_is_probed():
  """Methods are met through `methods.base.Method`'s declared hooks, never getattr/hasattr."""
  bad = set()
  for name in ("rlvr.rollout.step", "rlvr.rollout.buffer", "rlvr.learner.ppo", "rlvr.run.runner"):
    for node in ast.walk(ast.parse(open(MODULES[name]).read())):
      if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and node.args
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == "method"
      ):
        bad.add((name, node.lineno))
  assert not bad, bad
