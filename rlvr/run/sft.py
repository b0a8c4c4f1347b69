"""Supervised fine-tuning on (prompt, completion) pairs with the learner's update step.

The GRPO update with advantage 1 on every completion token and the current
policy as the old one (ratio exp(logp - sg(logp)) = 1, inside any clip range)
has exactly the gradient of the mean completion log-likelihood, so SFT reuses
the sharded, micro-batched, checkpointed learner unchanged. NLL is reported
from the learner's `logp` metric.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def sft_arrays(
  pairs: Sequence[tuple[Sequence[int], Sequence[int]]], seq_len: int, pad_id: int = 0
) -> dict[str, np.ndarray]:
  """[rows, seq_len] right-padded prompt+completion; loss on completion tokens only."""
  from rlvr.learner.packing import pack_rows

  arrays = pack_rows([(p, c, None) for p, c in pairs], len(pairs), seq_len, pad_id)
  del arrays["sampler_logp_bt"]  # no sampler: no mismatch metrics
  return dict(arrays, advantages=np.ones((len(pairs),), np.float32))


def encode_pairs(tok, pairs_text, instruction: str, chat_template: str) -> list[tuple]:
  """(prompt ids, completion ids) of (problem, worked solution) rows: the prompt in the chat
  template, the solution as plain text (a special token's string in a row stays text), then
  the tokenizer's real eos."""
  from rlvr.data import tokens
  from rlvr.data.prompts import format_prompt

  return [
    (
      format_prompt(tok, p, instruction, chat_template),
      tokens.encode_plain(tok, c) + [tok.eos_token_id],
    )
    for p, c in pairs_text
  ]


def run_sft(
  state,
  update_fn,
  pairs,
  *,
  steps: int,
  batch_size: int,
  seq_len: int,
  to_batch: Callable,
  seed: int = 0,
  pad_id: int = 0,
  start_step: int = 0,
  on_step: Callable[[int, dict], None] | None = None,
  progress: bool = True,
):
  """`steps` updates on batches drawn epoch-wise (seeded shuffles) from `pairs`."""
  from rlvr.data.stream import DataStream

  stream = DataStream(len(pairs), seed, position=start_step * batch_size)
  it = range(start_step, steps)
  if progress:
    from tqdm import tqdm

    it = tqdm(it, desc="sft", unit="step", initial=start_step, total=steps)
  for step in it:
    batch = sft_arrays([pairs[i] for i in stream.next_indices(batch_size)], seq_len, pad_id)
    state, m = update_fn(state, to_batch(batch))
    m = {
      "nll": -float(m["logp"]),
      "grad_norm": float(m["grad_norm"]),
      "lr": float(m["lr"]),
      "tokens": float(m["tokens"]),
    }
    if progress:
      it.set_postfix(nll=f"{m['nll']:.3f}")
    if on_step is not None:
      on_step(step, m)
  return state


def train_sft(
  model_dir: str,
  pairs_text: Sequence[tuple[str, str]],
  workdir: str,
  *,
  learner_cfg,
  mesh,
  instruction: str = "",
  chat_template: str = "",
  steps: int,
  batch_size: int,
  seed: int = 0,
  checkpoint_every: int = 100,
  keep: int = 2,
  progress: bool = True,
  model_cfg=None,
) -> str:
  """SFT of the HF model in `model_dir` on (problem text, completion text) pairs.

  Prompts go through the chat template `chat_template` names (`rlvr.data.prompts.format_prompt`;
  "" the tokenizer's own, as RL renders them with `data.chat_template`), completions
  end with the tokenizer's EOS. Checkpoints (orbax) every `checkpoint_every`
  steps under workdir/checkpoints and resumes from them; writes per-step
  metrics to workdir/metrics.jsonl and the result as an HF dir workdir/model with a
  checksum manifest, which it returns (and reuses when it verifies; else trains again). With
  `learner_cfg.lora.rank > 0` only LoRA adapters train (on the frozen model)
  and workdir/model is the base with them merged in (`rlvr.model.lora`). `model_cfg`: the
  model's `ModelConfig` where the caller has read it (else read from `model_dir`).
  """
  import os

  import jax
  from transformers import AutoTokenizer

  from rlvr import learner
  from rlvr import model as model_lib
  from rlvr.parallel import distributed
  from rlvr.report import metrics as metrics_lib
  from rlvr.run import checkpoint, interrupt

  out_dir = os.path.join(workdir, "model")
  if _verified(workdir, out_dir):
    print(f"SFT: done before, reusing {out_dir}", flush=True)
    return out_dir
  tok = AutoTokenizer.from_pretrained(model_dir)
  pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
  pairs = encode_pairs(tok, pairs_text, instruction, chat_template)
  if not pairs:
    raise ValueError(
      "train_sft: no (prompt, completion) pairs; give rows with a worked "
      "`solution` (config: data.sft_path) or skip SFT (sft.steps=0)"
    )
  seq_len = -(-max(len(p) + len(c) for p, c in pairs) // 16) * 16
  m_cfg = model_cfg or model_lib.ModelConfig.from_hf(model_dir)
  mngr, state, _ = checkpoint.restore_or_init(
    os.path.join(workdir, "checkpoints"),
    m_cfg,
    learner_cfg,
    mesh,
    lambda: model_lib.load_hf(model_dir, mesh=mesh)[1],
    seed=seed,
    keep=keep,
  )
  start = int(jax.device_get(state.step))
  if start:
    print(f"resumed SFT from step {start}", flush=True)
  update = learner.make_update_fn(m_cfg, learner_cfg, mesh)
  writer = metrics_lib.MetricsWriter(
    workdir, resume_step=start, tensorboard=False, enabled=distributed.is_writer()
  )
  to_batch = lambda arrays: learner.TrainBatch(**distributed.replicated_batch(arrays, mesh))

  def on_step(step, m):
    writer.write(step, m)
    stopping = stop.agreed()
    if ((step + 1) % checkpoint_every == 0 or stopping) and step + 1 < steps:
      checkpoint.save(mngr, state_ref[0], {"sft_step": step + 1})
    if stopping and step + 1 < steps:
      writer.close()
      stop.exit(f"after SFT step {step + 1} of {steps} (checkpoint under {workdir}/checkpoints)")

  # run_sft hands back only the final state; keep a reference for checkpoints.
  state_ref = [state]

  def update_and_keep(s, batch):
    s, m = update(s, batch)
    state_ref[0] = s
    return s, m

  with interrupt.GracefulStop("SFT") as stop:
    state = run_sft(
      state,
      update_and_keep,
      pairs,
      steps=steps,
      batch_size=batch_size,
      seq_len=seq_len,
      to_batch=to_batch,
      seed=seed,
      pad_id=pad_id,
      start_step=start,
      on_step=on_step,
      progress=progress,
    )
  writer.close()
  mngr.close()
  # LoRA: merged. The manifest is written into the export before it is renamed into place.
  checkpoint.export_hf(out_dir, m_cfg, state, tokenizer=tok, manifest=True)
  return out_dir


def reuse(init_from: str, model_dir: str) -> str:
  """The finished SFT model `init_from` names (`sft.init_from`): a run's work dir, its sft/
  dir, or the sft/model/ dir itself, which must verify against its manifest (every file of
  the folder listed, `checkpoint_integrity.verify`) and be an SFT of the run's model
  `model_dir` (`check_fits`); else a one-line ValueError naming the field."""
  import os

  from rlvr.run import checkpoint_integrity

  tried = [os.path.join(init_from, "sft", "model"), os.path.join(init_from, "model"), init_from]
  found = next((d for d in tried if os.path.isfile(os.path.join(d, "config.json"))), None)
  if found is None:
    raise ValueError(
      f"sft.init_from: no finished SFT model in {init_from!r} (looked for config.json in "
      f"{', '.join(tried)})"
    )
  problem = checkpoint_integrity.verify(found)
  if problem is not None:
    raise ValueError(f"sft.init_from: {found} does not verify: {problem.file}: {problem.detail}")
  check_fits(found, model_dir)
  print(f"SFT: reusing {found} (sft.init_from)", flush=True)
  return found


def check_fits(found: str, model_dir: str) -> None:
  """A one-line ValueError naming sft.init_from when the HF model in `found` is not one the
  run with model `model_dir` can start from: another vocabulary size (the run's token ids
  would index past its embedding table), another architecture (any `ModelConfig` field),
  or another tokenizer (its vocabulary, token to id, or its special tokens' ids)."""
  import dataclasses

  from rlvr.model.config import ModelConfig

  where = f"sft.init_from: {found}"
  have, want = ModelConfig.from_hf(found), ModelConfig.from_hf(model_dir)
  if have.vocab_size != want.vocab_size:
    raise ValueError(
      f"{where} has a vocabulary of {have.vocab_size} tokens, the run's model "
      f"{want.vocab_size} ({model_dir}); give an SFT of the run's model"
    )
  differ = [
    f"{f.name} {getattr(have, f.name)!r}, the run's {getattr(want, f.name)!r}"
    for f in dataclasses.fields(ModelConfig)
    if getattr(have, f.name) != getattr(want, f.name)
  ]
  if differ:
    raise ValueError(
      f"{where} is another architecture than the run's model: {'; '.join(differ)} "
      f"({model_dir}); give an SFT of the run's model"
    )
  detail = _tokenizer_difference(found, model_dir)
  if detail:
    raise ValueError(
      f"{where} has another tokenizer than the run's model ({model_dir}): {detail}; give an "
      "SFT of the run's model"
    )


def _tokenizer_difference(found: str, model_dir: str) -> str:
  """How the tokenizer saved in `found` differs from `model_dir`'s, in words; "" if not."""
  from transformers import AutoTokenizer

  try:
    have = AutoTokenizer.from_pretrained(found)
  except Exception as e:  # noqa: BLE001 - any loading error is the folder's, said in one line
    lines = str(e).strip().splitlines() or [type(e).__name__]
    return f"its own does not load ({lines[0]})"
  want = AutoTokenizer.from_pretrained(model_dir)
  a, b = have.get_vocab(), want.get_vocab()
  if len(a) != len(b):
    return f"{len(a)} tokens, the run's {len(b)}"
  for token, i in sorted(b.items(), key=lambda kv: kv[1]):
    if a.get(token) != i:
      there = "not in it" if a.get(token) is None else f"id {a[token]}"
      return f"token {token!r} is {there}, the run's id {i}"
  for name in ("eos_token_id", "bos_token_id", "pad_token_id", "unk_token_id"):
    if getattr(have, name) != getattr(want, name):
      return f"{name} {getattr(have, name)}, the run's {getattr(want, name)}"
  return ""


def _verified(workdir: str, out_dir: str) -> bool:
  """Whether a finished SFT phase left `out_dir` whole: its manifest lists every file of the
  folder, each there with its size and checksum (`checkpoint_integrity.verify`). One that
  does not verify, or has no manifest (an rlvr without checksums wrote it), is moved to
  `workdir`/corrupt/model-<reason> with one line saying why, and SFT runs again.
  Process 0 checks and moves; every process gets its answer."""
  import os
  import sys

  import jax

  from rlvr.parallel import distributed
  from rlvr.run import checkpoint_integrity

  ok = False
  if distributed.is_writer() and os.path.isdir(out_dir):
    problem = checkpoint_integrity.verify(out_dir)
    ok = problem is None
    if not ok:
      dest = checkpoint_integrity.move_aside(workdir, "model", problem)
      print(
        f"SFT: {out_dir} does not verify: {problem.file}: {problem.detail}; moved to {dest}; "
        "training it again",
        file=sys.stderr,
        flush=True,
      )
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    ok = bool(multihost_utils.broadcast_one_to_all(np.int32(ok)))
  return ok
