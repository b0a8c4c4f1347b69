"""What README.md and the docs pages name as rlvr's exists: every `rlvr.x.y` module path
imports (and its attribute is there), every config path they give (`--config.seed=1`, or a
backticked dotted path that starts with a config section, `rl.loop.group_size`) is a field
of the config, and every link to a page of the repository reaches the page and its
anchor (`docs/rewards.md#the-reward-proven-before-step-1`, `#anchor`), by GitHub's rules.

Conservative on purpose: a backticked dotted name counts as a config path only when its first
part is a section of the config (`rl`, `data`, `reward`, ...), and it is passed when it names
an attribute of the rlvr module of that name instead (`model.forward`: `rlvr.model.forward`),
a file (`svs.png`), or a name that `launch.train` answers with one line naming rlvr's path,
which the docs show on purpose: a derived field (`rl.loop.seed`), a field that moved, and on
docs/coming-from-verl-trl.md verl's or TRL's name for a setting (`rlvr.common.vocabulary`)."""

from __future__ import annotations

import collections
import dataclasses
import functools
import glob
import importlib
import os
import re

import pytest
from paths import REPO

PAGES = sorted(
  os.path.relpath(p, REPO)
  for p in ["README.md", "tests/README.md", *glob.glob(os.path.join(REPO, "docs", "*.md"))]
)
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
FILE_ENDINGS = {
  "png", "json", "jsonl", "py", "md", "parquet", "yaml", "txt", "lock", "gguf",
  "safetensors", "toml", "sh", "csv", "html", "log", "pt", "bin",
}  # fmt: skip
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def _read(page: str) -> str:
  with open(os.path.join(REPO, page)) as f:
    return f.read()


def _prose(text: str) -> str:
  """The page without its fenced blocks."""
  return FENCE.sub("", text)


# ------------------------------------------------------------------ rlvr.x.y
@functools.cache
def _resolves(dotted: str) -> bool:
  """`rlvr.a.b.C.d`: the longest importable module prefix, then attributes (a dataclass
  field counts as an attribute of its class)."""
  parts = dotted.split(".")
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ModuleNotFoundError as e:
      if e.name is not None and not ".".join(parts[:i]).startswith(e.name):
        raise  # the module exists but imports something missing: not the docs' fault
      continue
    for name in parts[i:]:
      if hasattr(obj, name):
        obj = getattr(obj, name)
      elif dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
        return name == parts[-1]
      else:
        return False
    return True
  return False


def _module_paths(text: str) -> set[str]:
  return set(re.findall(rf"(?<![\w./-])rlvr(?:\.{IDENT})+", text))


def test_every_rlvr_module_path_exists():
  missing = [
    (page, name)
    for page in PAGES
    for name in sorted(_module_paths(_read(page)))
    if not _resolves(name)
  ]
  assert not missing, f"rlvr names the docs give that do not exist: {missing}"


# ------------------------------------------------------------------ config paths
@functools.cache
def _config() -> tuple[frozenset[str], frozenset[str]]:
  """(every path of the config: sections and leaves, its top-level sections)."""
  from configs import tiny_rlvr

  tree = tiny_rlvr.get_config().to_dict()

  def walk(d, prefix):
    for k, v in d.items():
      yield f"{prefix}{k}"
      if isinstance(v, dict):
        yield from walk(v, f"{prefix}{k}.")

  sections = frozenset(k for k, v in tree.items() if isinstance(v, dict))
  return frozenset(walk(tree, "")), sections


def _config_names(text: str) -> set[str]:
  """`--config.a.b` flags anywhere on the page; backticked dotted paths in its prose."""
  paths, sections = _config()
  found = set(re.findall(rf"--config\.({IDENT}(?:\.{IDENT})*)", text))
  for span in re.findall(r"`([^`\n]+)`", _prose(text)):
    m = re.fullmatch(rf"(?:--config\.)?({IDENT}(?:\.{IDENT})+)(?:=\S*)?", span.strip())
    if m and m.group(1).split(".")[0] in sections:
      found.add(m.group(1))
  top = {p for p in paths if "." not in p}
  return {n for n in found if n.split(".")[0] in top}


def _answered(name: str, page: str) -> bool:
  """A name launch.train answers with one line naming rlvr's path, which the docs show on
  purpose: a derived field (`rl.loop.seed` is `seed`), one that moved, and on the page of
  verl's and TRL's names (`rlvr.common.vocabulary.DOC`) one of theirs."""
  from rlvr.common import vocabulary
  from rlvr.run import experiment

  if name in experiment.derived_paths() or name in experiment.MOVED:
    return True
  section, _, field = name.rpartition(".")
  return page == vocabulary.DOC and (
    name in vocabulary.VERL
    or name in vocabulary.TRL
    or bool(vocabulary.unknown_field(section, field))
  )


def _is_config_path(name: str, page: str) -> bool:
  paths, _ = _config()
  return (
    name in paths
    or name.rsplit(".", 1)[-1] in FILE_ENDINGS
    or _resolves(f"rlvr.{name}")  # model.forward, model.KVCache: the rlvr.model API
    or _answered(name, page)
  )


def test_every_config_path_exists():
  missing = [
    (page, name)
    for page in PAGES
    for name in sorted(_config_names(_read(page)))
    if not _is_config_path(name, page)
  ]
  assert not missing, f"config paths the docs give that the config has not: {missing}"


# ------------------------------------------------------------------ links and anchors
def slug(heading: str) -> str:
  """GitHub's anchor for a heading: markup and punctuation dropped, lowercase, spaces to '-'."""
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link: its text
  text = re.sub(r"[^\w\- ]", "", text.lower())
  return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
  """Every heading's anchor; a repeated one gets -1, -2, ... as on GitHub."""
  seen: collections.Counter[str] = collections.Counter()
  out = set()
  for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", _prose(text), re.M):
    base = slug(heading)
    out.add(base if not seen[base] else f"{base}-{seen[base]}")
    seen[base] += 1
  return out


def _links(text: str) -> list[str]:
  prose = re.sub(r"`[^`\n]*`", "", _prose(text))
  return re.findall(r"\]\(([^)\s]+)\)", prose)


def test_slug_follows_github():
  assert slug("Set up and run (fresh machine, Python 3.10+)") == (
    "set-up-and-run-fresh-machine-python-310"
  )
  assert slug("Settings: the `logging` section") == "settings-the-logging-section"
  assert slug("A whole GRPO job against TRL (SmolLM2-135M-Instruct)") == (
    "a-whole-grpo-job-against-trl-smollm2-135m-instruct"
  )
  assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


@pytest.mark.parametrize("page", PAGES)
def test_every_internal_link_reaches_its_page_and_anchor(page):
  broken = []
  for target in _links(_read(page)):
    if re.match(r"[a-z]+:", target):  # https:, mailto:
      continue
    path, _, anchor = target.partition("#")
    where = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
    if not os.path.exists(os.path.join(REPO, where)):
      broken.append((target, "no such file"))
    elif anchor and where.endswith(".md") and anchor not in anchors(_read(where)):
      broken.append((target, f"no heading of {where} has that anchor"))
  assert not broken, f"{page}: {broken}"


# ------------------------------------------------------------------ the run in two functions
def without_docstring(fn) -> str:
  """A function's source as it is in its file, dedented, its docstring left out."""
  import ast
  import inspect
  import textwrap

  lines = textwrap.dedent(inspect.getsource(fn)).splitlines()
  doc = ast.parse("\n".join(lines)).body[0].body[0]
  if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant):
    del lines[doc.lineno - 1 : doc.end_lineno]
  return "\n".join(lines) + "\n"


def test_architecture_opens_with_fit_and_rl_step_as_they_are():
  """docs/architecture.md prints `Trainer.fit` and `rl_step` first, as the code has them
  (statement for statement; the page's lines may wrap where the source's do not)."""
  import ast

  from rlvr import rollout
  from rlvr.run.trainer import Trainer

  blocks = re.findall(r"^```python\n(.*?)^```", _read("docs/architecture.md"), re.S | re.M)
  code = [without_docstring(Trainer.fit), without_docstring(rollout.rl_step)]
  # the same code, however the page's formatter wraps its lines
  assert [ast.dump(ast.parse(b)) for b in blocks[:2]] == [ast.dump(ast.parse(c)) for c in code]
