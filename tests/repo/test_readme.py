"""The README's Python blocks, and those of the docs pages that print whole examples (a method,
a reward, an environment of your own), run as printed."""

from __future__ import annotations

import os
import re

from paths import REPO

# docs/architecture.md and docs/moe.md print fragments (arrays left undefined), not whole examples.
PAGES = ("README.md", "docs/code.md", "docs/envs.md", "docs/methods.md", "docs/rewards.md")


def test_readme_python_blocks_run(tmp_path, monkeypatch):
  blocks = [
    (page, block)
    for page in PAGES
    # fences at the start of a line: an indented one shows what a policy writes
    for block in re.findall(
      r"^```python\n(.*?)^```", open(os.path.join(REPO, page)).read(), re.S | re.M
    )
  ]
  assert len(blocks) >= 3 and {page for page, _ in blocks} == set(PAGES), blocks
  monkeypatch.chdir(tmp_path)
  copies = []
  for page, block in blocks:
    namespace = {"__name__": "readme_block"}
    exec(compile(block, page, "exec"), namespace)  # noqa: S102 - our own pages
    if "work" in namespace:  # the model example writes its copy under a temporary dir
      copies.append(os.path.join(namespace["work"], "copy"))
  from transformers import AutoModelForCausalLM, AutoTokenizer

  [copy] = copies
  AutoModelForCausalLM.from_pretrained(copy)
  assert AutoTokenizer.from_pretrained(copy).encode("1+2=3")
