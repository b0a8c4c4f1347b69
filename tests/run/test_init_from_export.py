"""`sft.init_from` reuses only a folder that fits the run and whose manifest covers it
whole; `export_every` writes clean folders.

In process, through the functions a run calls: `trainer.warm_start` (which resolves
`sft.init_from`), `checkpoint_integrity.verify` (the manifest check it applies) and
`checkpoint.export_hf` (each export). The run's model is a tiny one with a 320-token
tokenizer; the SFT folders differ from it in one thing each."""

from __future__ import annotations

import json
import os
import shutil
import types

import jax
import numpy as np
import pytest

from rlvr import learner
from rlvr import model as model_lib
from rlvr.model import decoder
from rlvr.parallel import sharding
from rlvr.run import checkpoint, checkpoint_integrity, trainer

VOCAB = 320  # the run's tokenizer: 320 tokens, a 320-row embedding table


def _tiny(path: str, tokenizer_seed: int = 0, **overrides) -> str:
  """A tiny HF model (`make_tiny`'s shape) with a 320-token tokenizer trained on
  `tokenizer_seed`'s corpus; random weights drawn on the host (what they are does not
  matter here, and `decoder.init` would take most of the module's time)."""
  tok = model_lib.train_tokenizer(path, VOCAB, seed=tokenizer_seed)
  kw = dict(model_lib.TINY, vocab_size=VOCAB, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
  cfg = model_lib.ModelConfig(**dict(kw, **overrides))
  rng = np.random.default_rng(0)
  params = jax.tree.map(
    lambda s: rng.normal(0, 0.02, s.shape).astype(s.dtype), decoder.param_shapes(cfg)
  )
  return model_lib.save_hf(path, cfg, params)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  """{name: HF dir}: the run's model, and SFT folders (with manifests) of another
  vocabulary size, another tokenizer, another architecture."""
  root = tmp_path_factory.mktemp("models")
  out = {
    "run": _tiny(str(root / "run")),
    "vocab_64": _tiny(str(root / "vocab_64"), vocab_size=64),
    "tokenizer": _tiny(str(root / "tokenizer"), tokenizer_seed=1),  # other merges
    "architecture": _tiny(str(root / "architecture"), intermediate_size=192),
  }
  for name in ("vocab_64", "tokenizer", "architecture"):
    checkpoint_integrity.write_manifest(out[name])
  return out


def _state(model_dir: str):
  cfg, params = model_lib.load_hf(model_dir)
  mesh = sharding.make_mesh({"fsdp": 1}, jax.devices()[:1])
  return cfg, learner.init_state(cfg, learner.LearnerConfig(), params, mesh)


@pytest.fixture(scope="module")
def sft_export(models, tmp_path_factory):
  """The run's model exported as the SFT phase exports its result (tokenizer, manifest)."""
  from transformers import AutoTokenizer

  cfg, state = _state(models["run"])
  out = str(tmp_path_factory.mktemp("sft") / "model")
  tok = AutoTokenizer.from_pretrained(models["run"])
  checkpoint.export_hf(out, cfg, state, tokenizer=tok)
  checkpoint_integrity.write_manifest(out)
  return out


def _warm_start(init_from: str, model_dir: str) -> str:
  """`trainer.warm_start` of a run whose model is `model_dir`, with sft.init_from set."""
  settings = types.SimpleNamespace(sft=types.SimpleNamespace(init_from=init_from, steps=0))
  return trainer.warm_start(types.SimpleNamespace(settings=settings, model_dir=model_dir))


def _copy(src: str, dest) -> str:
  shutil.copytree(src, dest)
  return str(dest)


def test_an_sft_of_the_runs_model_is_reused(models, sft_export):
  assert _warm_start(sft_export, models["run"]) == sft_export


@pytest.mark.parametrize(
  "name, says",
  [
    ("vocab_64", "a vocabulary of 64 tokens, the run's model 320"),
    ("tokenizer", "another tokenizer than the run's model"),
    ("architecture", "another architecture than the run's model: intermediate_size 192, "),
  ],
)
def test_an_sft_that_does_not_fit_the_run_is_refused_in_one_line(models, name, says):
  with pytest.raises(ValueError) as e:
    _warm_start(models[name], models["run"])
  message = str(e.value)
  assert message.startswith(f"sft.init_from: {models[name]} ") and says in message, message
  assert "\n" not in message


def _manifest(folder: str) -> dict:
  with open(os.path.join(folder, checkpoint_integrity.MANIFEST)) as f:
    return json.load(f)


def _rewrite_manifest(folder: str, body: dict) -> None:
  with open(os.path.join(folder, checkpoint_integrity.MANIFEST), "w") as f:
    json.dump(body, f)


def test_a_manifest_that_lists_no_files_does_not_verify(sft_export, tmp_path):
  folder = _copy(sft_export, tmp_path / "model")
  _rewrite_manifest(folder, dict(_manifest(folder), files={}))
  problem = checkpoint_integrity.verify(folder)
  assert problem is not None and problem.file == checkpoint_integrity.MANIFEST, problem
  assert problem.detail == "the manifest lists no files"


@pytest.mark.parametrize("entry", ["../outside.txt", "ABSOLUTE"])
def test_a_manifest_entry_outside_the_folder_is_refused_unread(sft_export, tmp_path, entry):
  folder = _copy(sft_export, tmp_path / "model")
  outside = tmp_path / "outside.txt"
  outside.write_text("not the model's\n")
  entry = str(outside) if entry == "ABSOLUTE" else entry
  body = _manifest(folder)
  # The entry is the outside file's true size and checksum: only where it lies is wrong.
  n, digest = checkpoint_integrity._digest(str(outside))
  body["files"][entry] = {"bytes": n, "blake2b": digest}
  _rewrite_manifest(folder, body)
  problem = checkpoint_integrity.verify(folder)
  assert problem is not None and (problem.file, problem.reason) == (entry, "manifest"), problem
  assert problem.detail == "outside the folder (a manifest entry must name a file inside it)"


def test_a_file_the_manifest_does_not_list_is_refused_in_one_line(models, sft_export, tmp_path):
  """An unlisted shard index beside a verified model.safetensors would make transformers
  (and `load_hf`) read the weights it names instead."""
  folder = _copy(sft_export, tmp_path / "model")
  other = _copy(models["architecture"], tmp_path / "other")
  shutil.copy(os.path.join(other, "model.safetensors"), os.path.join(folder, "other.safetensors"))
  checkpoint_integrity.write_manifest(folder)  # other.safetensors listed; the index below is not
  with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": {"model.norm.weight": "other.safetensors"}}, f)
  problem = checkpoint_integrity.verify(folder)
  assert problem is not None and problem.file == "model.safetensors.index.json", problem
  assert problem.reason == "unlisted"
  with pytest.raises(ValueError) as e:
    _warm_start(folder, models["run"])
  assert str(e.value) == (
    f"sft.init_from: {folder} does not verify: model.safetensors.index.json: not in the "
    "manifest (every file of the folder must be listed)"
  )


def test_an_export_into_a_used_folder_leaves_only_the_fresh_export(models, tmp_path):
  """Stale files of what the folder held before (a PEFT adapter's config, a manifest, a
  slow tokenizer's merges) are gone; transformers loads the export as it is."""
  from transformers import AutoModelForCausalLM, AutoTokenizer

  cfg, state = _state(models["run"])
  tok = AutoTokenizer.from_pretrained(models["run"])
  clean = checkpoint.export_hf(str(tmp_path / "clean"), cfg, state, tokenizer=tok)
  used = tmp_path / "policy_steps" / "step_1"
  used.mkdir(parents=True)
  stale = {
    "adapter_config.json": json.dumps({"peft_type": "LORA", "base_model_name_or_path": "gone"}),
    checkpoint_integrity.MANIFEST: json.dumps({"format": 1, "files": {}}),
    "special_tokens_map.json": json.dumps({"eos_token": "<stale>"}),
    "merges.txt": "#version: 0.2\nx y\n",
  }
  for name, text in stale.items():
    (used / name).write_text(text)
  out = checkpoint.export_hf(str(used), cfg, state, tokenizer=tok)
  assert out == str(used)
  AutoModelForCausalLM.from_pretrained(str(used))
  assert sorted(os.listdir(used)) == sorted(os.listdir(clean))
  assert not [n for n in os.listdir(used.parent) if n != "step_1"]  # no temporary left
