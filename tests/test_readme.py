"""The README's Python blocks run as printed."""

from __future__ import annotations

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_python_blocks_run(tmp_path, monkeypatch):
  text = open(os.path.join(REPO, "README.md")).read()
  blocks = re.findall(r"```python\n(.*?)```", text, re.S)
  assert len(blocks) >= 2
  monkeypatch.chdir(tmp_path)
  for block in blocks:
    namespace = {"__name__": "readme_block"}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - our own README
  from transformers import AutoModelForCausalLM, AutoTokenizer

  AutoModelForCausalLM.from_pretrained("/tmp/copy")
  assert AutoTokenizer.from_pretrained("/tmp/copy").encode("1+2=3")
