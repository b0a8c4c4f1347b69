"""The tokenizer of a GGUF file (llama.cpp's format), as `gguf_io.convert` writes it.

`tokenizer(g)` builds the transformers tokenizer that the file's metadata describes (special
tokens and chat template included), and `_check_chat_template` renders its chat template once
in a sandbox before the folder is written.

What would convert into a damaged model is refused instead, each a one-line `GGUFError`:
a special token id (bos, eos, unk, pad) that names a token the file does not mark as a
control token (made special, an ordinary token such as "a" would vanish from every decoded
response), a special id the built tokenizer reads as another id (its text held twice in the
vocabulary), and a chat template that does not render one user message in a sandbox within
`TEMPLATE_SECONDS`, `TEMPLATE_MEMORY` and `TEMPLATE_CHARS`.
"""

from __future__ import annotations

import json
import subprocess
import sys

# tokenizer attribute -> the metadata key of its id (tokenizer.ggml.*).
_SPECIAL_TOKENS = {
  "bos_token": "bos_token_id",
  "eos_token": "eos_token_id",
  "unk_token": "unknown_token_id",
  "pad_token": "padding_token_id",
}
# tokenizer.ggml.token_type values a special id may name (llama.cpp's CONTROL; UNKNOWN for
# the unknown token).
_CONTROL, _UNKNOWN = 3, 2
# The chat template's trial render (`_check_chat_template`): its wall time, the address space
# of the process it runs in, and the characters one short user message may render to.
TEMPLATE_SECONDS = 10.0
TEMPLATE_MEMORY = 1 << 30
TEMPLATE_CHARS = 1 << 16


def _fail(path: str, what: str):
  from rlvr.model.gguf_file import GGUFError

  raise GGUFError(f"{path}: {what}")


def tokenizer(g):
  """The transformers tokenizer that `g`'s metadata describes."""
  from transformers import PreTrainedTokenizerFast
  from transformers.integrations.gguf.gguf_tokenizer_mapping import (
    GGUF_TOKENIZER_MAPPING,
    convert_gguf_tokenizer,
  )

  md = g.metadata
  tokens = md.get("tokenizer.ggml.tokens")
  if not isinstance(tokens, list) or not tokens:
    _fail(g.path, "no tokenizer in its metadata (tokenizer.ggml.tokens)")
  spec, settings = (
    {
      name: md[f"tokenizer.{key}"]
      for key, name in GGUF_TOKENIZER_MAPPING[group].items()
      if f"tokenizer.{key}" in md
    }
    for group in ("tokenizer", "tokenizer_config")
  )
  ids = _special_ids(g, tokens)
  settings.update({name: tokens[i] for name, i in ids.items()})
  try:
    backend, _ = convert_gguf_tokenizer(md["general.architecture"], spec)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, **settings)
  except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exceptions
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    _fail(g.path, f"tokenizer: {reason}")
  for name, i in ids.items():  # config.json and generation_config.json say `i`
    got = getattr(tok, f"{name}_id")
    if got != i:
      n = tokens.count(tokens[i])
      held = f" (the vocabulary holds it {n} times)" if n > 1 else ""
      _fail(
        g.path,
        f"metadata tokenizer.ggml.{_SPECIAL_TOKENS[name]} {i} names {tokens[i]!r}, which the "
        f"tokenizer reads as id {got}{held}",
      )
  return tok


def _special_ids(g, tokens: list[str]) -> dict[str, int]:
  """tokenizer attribute (bos_token, ...) -> the id the metadata gives it. Each must name a
  token the file marks CONTROL (or, for the unknown token, UNKNOWN), as llama.cpp's converter
  marks special tokens: made special, an ordinary token would vanish from every decoded text."""
  md, ids = g.metadata, {}
  types = md.get("tokenizer.ggml.token_type")
  if types is not None and len(types) != len(tokens):
    _fail(
      g.path, f"metadata tokenizer.ggml.token_type: {len(types)} types for {len(tokens)} tokens"
    )
  for name, key in _SPECIAL_TOKENS.items():
    i = md.get(f"tokenizer.ggml.{key}")
    if i is None:
      continue
    where = f"metadata tokenizer.ggml.{key} {i}"
    if not 0 <= i < len(tokens):
      _fail(g.path, f"{where} not in 0..{len(tokens) - 1}")
    if types is None:
      _fail(g.path, f"{where}: no tokenizer.ggml.token_type to mark {tokens[i]!r} a control token")
    if types[i] not in ((_CONTROL, _UNKNOWN) if name == "unk_token" else (_CONTROL,)):
      _fail(
        g.path,
        f"{where} names {tokens[i]!r}, which is not a control token (token_type {types[i]}): "
        "as a special token it would vanish from decoded text",
      )
    ids[name] = i
  return ids


# The trial render, run as `python -I -c _RENDER MEMORY` with the job as JSON on stdin: an
# environment as transformers' apply_chat_template builds it (jinja2's immutable sandbox,
# trim_blocks, lstrip_blocks, loopcontrols, the {% generation %} block, raise_exception,
# strftime_now, tojson), its address space capped. It prints {"chars": n} or {"error": line}.
_RENDER = r"""
import json, resource, sys
from datetime import datetime

memory = int(sys.argv[1])
try:
  resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
except (ValueError, OSError):
  pass
import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
  tags = {"generation"}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
    return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

  def _body(self, caller):
    return caller()


def raise_exception(message):
  raise jinja2.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main(job):
  env = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
  )
  env.filters["tojson"] = tojson
  env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f))
  loads = (nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport)
  if any(env.parse(job["template"]).find_all(loads)):
    return {"error": "it loads another template (extends, include or import), which a tokenizer's template cannot"}
  return {"chars": len(env.from_string(job["template"]).render(**job["context"]))}


try:
  out = main(json.loads(sys.stdin.read()))
except MemoryError:
  out = {"error": f"it needs more than {memory >> 20} MiB to render"}
except BaseException as e:
  out = {"error": (f"{type(e).__name__}: {e}".strip().splitlines() or [""])[0]}
sys.stdout.write(json.dumps(out))
"""


def _check_chat_template(g, tok) -> None:
  """The file's chat template renders one user message, as a prompt is rendered, in a child
  process: within `TEMPLATE_SECONDS` (then killed), `TEMPLATE_MEMORY` bytes of address space
  and `TEMPLATE_CHARS` characters of output, loading no other template."""
  template = g.metadata.get("tokenizer.chat_template")
  if template is None:
    return
  specials = {k: v for k, v in tok.special_tokens_map.items() if isinstance(v, str)}
  message = {"role": "user", "content": "What is 12 + 7?"}
  context = {"messages": [message], "add_generation_prompt": True, **specials}
  try:
    done = subprocess.run(
      [sys.executable, "-I", "-c", _RENDER, str(TEMPLATE_MEMORY)],
      input=json.dumps({"template": template, "context": context}),
      capture_output=True,
      text=True,
      timeout=TEMPLATE_SECONDS,
    )
  except subprocess.TimeoutExpired:
    _fail(g.path, f"chat template: still rendering one user message after {TEMPLATE_SECONDS:g} s")
  try:
    out = json.loads(done.stdout)
  except ValueError:
    last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    _fail(g.path, f"chat template: its trial render ended without a result: {last}")
  if "error" in out:
    _fail(g.path, f"chat template does not render one user message: {out['error']}")
  if out["chars"] > TEMPLATE_CHARS:
    _fail(
      g.path,
      f"chat template: one user message renders to {out['chars']} characters, more than "
      f"{TEMPLATE_CHARS}",
    )
