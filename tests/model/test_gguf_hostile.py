"""GGUF files that convert into a damaged model unless refused: special ids on ordinary
text, an eos the tokenizer reads as another id, metadata of the wrong type, NaN or infinite
weights, chat templates that never finish or never stop growing, and a model cache that
must match its file. Each goes through `model.path` as a run reads it (`_prepare`)."""

from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest
from test_gguf import _as_gguf, _one_line, _patched, _prepare, _tiny, _tokenizer_metadata

from rlvr.model import gguf_cache, gguf_tokenizer
from rlvr.model.gguf_file import GGUFError, GGUFFile

_BYTE_A = _tokenizer_metadata(320)["tokenizer.ggml.tokens"].index("a")  # the ordinary token "a"


@pytest.fixture(scope="module")
def tiny():
  return _tiny("llama")


def _file(tmp_path, tiny, name="m.gguf", **metadata) -> str:
  cfg, params = tiny
  return _as_gguf(tmp_path / name, cfg, params, metadata=metadata)


def _refused(tmp_path, file, *fragments):
  with pytest.raises(GGUFError) as e:
    _prepare(file, str(tmp_path / "cache"))
  _one_line(e, file, *fragments)


# ------------------------------------------------------------------ special tokens
@pytest.mark.parametrize(
  "key", ["padding_token_id", "eos_token_id", "bos_token_id", "unknown_token_id"]
)
def test_a_special_id_on_an_ordinary_token_is_refused(tiny, tmp_path, key):
  """Made special, the token "a" would vanish from every decoded response."""
  file = _file(tmp_path, tiny, **{f"tokenizer.ggml.{key}": _BYTE_A})
  _refused(tmp_path, file, f"tokenizer.ggml.{key} {_BYTE_A}", "'a'", "not a control token")


def test_special_ids_without_token_types_are_refused(tiny, tmp_path):
  file = _file(tmp_path, tiny, **{"tokenizer.ggml.token_type": None})
  _refused(tmp_path, file, "tokenizer.ggml.token_type")


def test_the_special_tokens_of_a_good_file_stay_whole(tiny, tmp_path):
  from transformers import AutoTokenizer

  tok = AutoTokenizer.from_pretrained(_prepare(_file(tmp_path, tiny), str(tmp_path / "cache")))
  text = "The answer is a banana, 42."
  assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text
  assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (257, 258, 256)
  assert tok("<|im_start|>assistant").input_ids[0] == 257


def test_an_eos_held_twice_in_the_vocabulary_is_refused(tiny, tmp_path):
  """The tokenizer would read "<|im_end|>" as id 319, config.json says 258."""
  md = _tokenizer_metadata(320)
  tokens, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
  file = _file(
    tmp_path,
    tiny,
    **{
      "tokenizer.ggml.tokens": [*tokens[:-1], "<|im_end|>"],
      "tokenizer.ggml.token_type": [*types[:-1], 3],
      "tokenizer.ggml.merges": md["tokenizer.ggml.merges"][:-1],  # the one that made token 319
    },
  )
  _refused(tmp_path, file, "tokenizer.ggml.eos_token_id 258", "'<|im_end|>'", "319")


# ------------------------------------------------------------------ metadata types
@pytest.mark.parametrize(
  "key, value, fragment",
  [
    ("tokenizer.ggml.eos_token_id", True, "a bool"),
    ("tokenizer.ggml.padding_token_id", "256", "a string"),
    ("tokenizer.chat_template", 7, "an integer"),
    ("tokenizer.ggml.add_bos_token", 1, "an integer"),
    ("tokenizer.ggml.merges", [1, 2, 3], "an array of integer"),
  ],
)
def test_metadata_of_the_wrong_type_is_one_line(tiny, tmp_path, key, value, fragment):
  file = _file(tmp_path, tiny, **{key: value})
  _refused(tmp_path, file, f"metadata {key!r}", fragment)


# ------------------------------------------------------------------ weights
@pytest.mark.parametrize(
  "tensor, value", [("blk.1.ffn_up.weight", float("nan")), ("output.weight", float("-inf"))]
)
def test_a_non_finite_weight_is_one_line_naming_its_tensor(tiny, tmp_path, tensor, value):
  good = _file(tmp_path, tiny, name="good.gguf")
  at = GGUFFile(good).tensors[tensor].start + 4 * 37
  bad = _patched(tmp_path, good, [(at, struct.pack("<f", value))])
  _refused(tmp_path, bad, f"tensor {tensor}", "1 of", "NaN or infinite")
  assert [n for n in os.listdir(tmp_path / "cache") if n.startswith("gguf-")] == []


# ------------------------------------------------------------------ chat templates
_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.mark.parametrize(
  "template, fragment",
  [
    (_LOOPS, "still rendering one user message after 2 s"),
    ("{{ 'x' * 10000000 }}", "10000000 characters"),
    ("{{ 'x' * 4000000000 }}", "more than"),
    ("{% include 'other.jinja' %}", "loads another template"),
    ("{% import 'm.jinja' as m %}{{ m }}", "loads another template"),
    ("{{ ''.__class__.__mro__ }}", "SecurityError"),
    ("{% for m in messages %}{{ m.content }", "TemplateSyntaxError"),
    ("{{ raise_exception('no\nsystem') }}", "TemplateError: no"),
  ],
)
def test_a_hostile_chat_template_is_one_line(tiny, tmp_path, monkeypatch, template, fragment):
  monkeypatch.setattr(gguf_tokenizer, "TEMPLATE_SECONDS", 2.0)
  file = _file(tmp_path, tiny, **{"tokenizer.chat_template": template})
  _refused(tmp_path, file, "chat template", fragment)


# ------------------------------------------------------------------ the cache
def _embeddings(hf_dir: str) -> np.ndarray:
  from safetensors.numpy import load_file

  return load_file(os.path.join(hf_dir, "model.safetensors"))["model.embed_tokens.weight"]


def test_a_file_replaced_with_its_size_and_mtime_kept_converts_again(tiny, tmp_path):
  """`cp -p` / `rsync -a` of another model over the file: same size, same mtime."""
  cache = str(tmp_path / "cache")
  file = _file(tmp_path, tiny)
  at = GGUFFile(file).tensors["token_embd.weight"].start
  other = _patched(tmp_path, file, [(at, struct.pack("<f", 0.5))], "other.gguf")
  first = _prepare(file, cache)
  st = os.stat(file)
  shutil.copyfile(other, file)
  os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))
  second = _prepare(file, cache)
  assert second != first
  np.testing.assert_array_equal(_embeddings(second), GGUFFile(other).array("token_embd.weight"))
  assert second.endswith(gguf_cache.digest(other)[:20])  # named by the bytes it converts


@pytest.mark.parametrize("stem", ["m" * 250, "é" * 125])  # 255 bytes with ".gguf"
def test_a_255_byte_file_name_converts(tiny, tmp_path, stem):
  file = str(tmp_path / f"{stem}.gguf")
  assert len(os.path.basename(file).encode()) == 255
  shutil.copyfile(_file(tmp_path, tiny), file)
  hf_dir = _prepare(file, str(tmp_path / "cache"))
  assert len(os.path.basename(hf_dir).encode()) <= 100
  assert os.path.basename(hf_dir).startswith(f"gguf-{stem[:8]}")


def test_a_half_written_cache_folder_is_rebuilt(tiny, tmp_path, capsys):
  cache, file = str(tmp_path / "cache"), _file(tmp_path, tiny)
  hf_dir = _prepare(file, cache)
  size = os.path.getsize(os.path.join(hf_dir, "model.safetensors"))
  os.remove(os.path.join(hf_dir, "config.json"))  # copied in part: every file but one
  assert _prepare(file, cache) == hf_dir
  assert os.path.exists(os.path.join(hf_dir, "config.json"))
  with open(os.path.join(hf_dir, "model.safetensors"), "r+b") as f:  # every file, one cut short
    f.truncate(size // 2)
  assert _prepare(file, cache) == hf_dir
  assert os.path.getsize(os.path.join(hf_dir, "model.safetensors")) == size
  shutil.rmtree(hf_dir)
  os.makedirs(hf_dir)  # an empty folder where the conversion goes
  assert _prepare(file, cache) == hf_dir
  out = capsys.readouterr().out
  assert out.count("converted to") == 4, out
  assert sorted(os.listdir(cache)) == [os.path.basename(hf_dir)]
  with open(os.path.join(hf_dir, gguf_cache.MARKER)) as f:
    assert json.load(f)["files"]["model.safetensors"] == size
