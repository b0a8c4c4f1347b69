"""The chat templates a run may render its prompts with (`data.chat_template`).

- "" or "tokenizer": the tokenizer's own template (what an instruct model was tuned with);
- "none": no template: the prompt text is tokenized as it is (the tokenizer's special tokens
  only, e.g. Llama's BOS), as base-model RL ("zero" RL) does;
- a name of `BUILTIN` ("chatml");
- anything else is a path to a Jinja file in the form of a tokenizer's `chat_template`.

`check` validates a setting at start-up; `source` gives the Jinja text `rlvr.data.prompts.format_prompt`
renders with (None: the tokenizer's own). Every error is one line naming data.chat_template.
"""

from __future__ import annotations

import functools
import os

from rlvr.common.chatml import CHATML

FIELD = "data.chat_template"
TOKENIZER, NONE = "tokenizer", "none"
BUILTIN = {"chatml": CHATML}


def is_raw(value: str) -> bool:
  """The setting renders no template: the prompt text as it is."""
  return value == NONE


@functools.lru_cache(maxsize=16)  # a file is read once per process: every prompt alike
def source(value: str) -> str | None:
  """The Jinja text the setting `value` renders prompts with; None for the tokenizer's own
  (and for "none", which renders none: `is_raw`)."""
  if value in ("", TOKENIZER, NONE):
    return None
  if value in BUILTIN:
    return BUILTIN[value]
  path = os.path.expanduser(value)
  if not os.path.isfile(path):
    raise ValueError(
      f"{FIELD}: unknown {value!r}: not '', {TOKENIZER!r}, {NONE!r}, a built-in template "
      f"({', '.join(sorted(BUILTIN))}) nor a Jinja file (no file at {os.path.abspath(path)})"
    )
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise ValueError(f"{FIELD}: cannot read {path}: {e}") from None
  if not text.strip():
    raise ValueError(f"{FIELD}: {path} is empty")
  return text


def check(value: str) -> None:
  """A one-line ValueError unless `value` is a usable setting (a file must exist and read)."""
  if not isinstance(value, str):
    raise ValueError(f"{FIELD}: expected a string, got {value!r}")
  source(value)
