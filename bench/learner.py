r"""Learner update-step throughput: ours (JAX) vs transformers' PyTorch model, same work.

  python bench/learner.py                      # 27M Qwen2, batch 8 x 512, f32, CPU
  python bench/learner.py --model=1.5b --seq=4096 --batch=4 --dtype=bfloat16 --skip_torch
  python bench/learner.py --seqs=256,512,1024,2048 --tokens=4096   # T-scaling table
  python bench/learner.py --model=moe          # 27M Qwen3-MoE (16 experts, 4 per token)
  python bench/learner.py --onednn             # XLA's oneDNN CPU dot path (off by default)
  python bench/learner.py --lora=16            # + LoRA rank 16: ours full vs ours LoRA vs PEFT

Both sides run forward + backward + AdamW on the same token-mean clipped
surrogate over the last 3/4 of each row. Prints tokens/s of each, their ratio,
and our model-FLOPs utilisation against a matmul peak measured here with jax.
With --lora=R also our step training rank-R adapters on every projection (frozen base)
beside our full step, with the memory XLA plans for each (state + batch + temporaries),
and transformers + PEFT training the same adapters.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_configs import CONFIGS, matmul_peak, model_flops_per_token  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "27m", ["27m", "moe", "1.5b", "smollm2"], "Config to benchmark.")
flags.DEFINE_integer("batch", 8, "Rows per update.")
flags.DEFINE_integer("seq", 512, "Tokens per row.")
flags.DEFINE_integer("steps", 3, "Timed steps (after one warm-up step).")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")
flags.DEFINE_bool("remat", False, "Rematerialise decoder layers.")
flags.DEFINE_bool(
  "scan_layers",
  False,
  "One lax.scan over the layers (the learner's default, "
  "for deep models) instead of unrolled layers (faster for this small model).",
)
flags.DEFINE_bool("skip_torch", False, "Only run ours.")
flags.DEFINE_list(
  "seqs",
  [],
  "T-scaling: run each of these row lengths with --tokens per step "
  "(e.g. 256,512,1024,2048) and print a table; overrides --batch / --seq.",
)
flags.DEFINE_integer("tokens", 4096, "Tokens per step for --seqs.")
flags.DEFINE_integer("lora", 0, "Also LoRA of this rank (alpha 2 x rank), ours and PEFT's.")
flags.DEFINE_bool(
  "onednn",
  False,
  "Compile our step with XLA's oneDNN CPU path for dots (ONEDNN_XLA_FLAGS; XLA leaves it "
  "off by default).",
)
ONEDNN_XLA_FLAGS = "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_fusion_type=dot"


def make_batch(cfg, batch, seq):
  import numpy as np

  rng = np.random.RandomState(0)
  tokens = rng.randint(0, cfg.vocab_size, (batch, seq)).astype(np.int32)
  mask = np.zeros((batch, seq), np.float32)
  mask[:, seq // 4 :] = 1
  adv = rng.randn(batch).astype(np.float32)
  return tokens, mask, adv


def bench_ours(cfg, tokens, mask, adv, lora_rank: int = 0):
  """(s/step, compile s, loss, GiB XLA plans for the step) of our update."""
  import jax
  import jax.numpy as jnp

  from rlvr import learner, model
  from rlvr.model.lora import LoraConfig
  from rlvr.parallel import sharding

  lc = learner.LearnerConfig(
    learning_rate=1e-6,
    compute_dtype=FLAGS.dtype,
    remat=FLAGS.remat,
    dual_clip=None,
    scan_layers=FLAGS.scan_layers,
    lora=LoraConfig(rank=lora_rank, alpha=2.0 * max(lora_rank, 1), dropout=0.0),
  )
  mesh = sharding.make_mesh({"fsdp": -1})
  params = model.init(cfg, jax.random.key(0))
  state = learner.init_state(cfg, lc, params, mesh)
  del params
  batch = learner.TrainBatch(
    tokens_bt=jnp.asarray(tokens),
    segment_bt=jnp.ones_like(tokens),
    loss_mask_bt=jnp.asarray(mask),
    advantages=jnp.asarray(adv),
  )
  t = time.perf_counter()
  update = learner.jit_train_step(cfg, lc, mesh, batch).lower(state, batch).compile()
  mem = update.memory_analysis()
  gib = (
    mem.argument_size_in_bytes
    + mem.temp_size_in_bytes
    + max(mem.output_size_in_bytes - mem.alias_size_in_bytes, 0)
  ) / 1024**3
  state, m = update(state, batch)
  jax.block_until_ready(m)
  compile_s = time.perf_counter() - t
  t = time.perf_counter()
  for _ in range(FLAGS.steps):
    state, m = update(state, batch)
  jax.block_until_ready(m)
  return (time.perf_counter() - t) / FLAGS.steps, compile_s, float(m["loss"]), gib


def bench_torch(cfg, tokens, mask, adv, lora_rank: int = 0):
  import torch
  import transformers

  torch.set_num_threads(os.cpu_count() or 1)
  hf = cfg.to_hf()
  arch = hf.pop("architectures")[0]  # Qwen2ForCausalLM / Qwen3MoeForCausalLM / ...
  config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
  tm = getattr(transformers, arch)(config_cls(**hf)).train()
  if FLAGS.dtype == "bfloat16":
    tm = tm.to(torch.bfloat16)
  if lora_rank:
    import peft

    modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    tm = peft.get_peft_model(
      tm, peft.LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules=modules)
    )
  trained = [p for p in tm.parameters() if p.requires_grad]
  opt = torch.optim.AdamW(trained, lr=1e-6, weight_decay=0.01)
  tok = torch.tensor(tokens, dtype=torch.long)
  m = torch.tensor(mask)[:, 1:]
  a = torch.tensor(adv)[:, None]

  def step():
    logits = tm(tok).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, tok[:, 1:, None])[..., 0]
    ratio = torch.exp(logp - logp.detach())
    per = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.28))
    loss = (per * m).sum() / m.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trained, 1.0)
    opt.step()
    return float(loss)

  step()
  t = time.perf_counter()
  for _ in range(FLAGS.steps):
    loss = step()
  return (time.perf_counter() - t) / FLAGS.steps, loss


def _compare(cfg, batch, seq, peak):
  """One row: ours and (unless skipped) torch on the same batch, and with --lora both again
  with adapters; returns tokens/s of ours and torch (full fine-tuning)."""
  tokens, mask, adv = make_batch(cfg, batch, seq)
  n_tok = batch * seq
  flops = model_flops_per_token(cfg, seq) * n_tok
  ours_s, compile_s, ours_loss, gib = bench_ours(cfg, tokens, mask, adv)
  print(
    f"T={seq:5d} x {batch:3d} rows  ours:  {ours_s:.3f} s/step  {n_tok / ours_s:10,.0f} "
    f"tokens/s  MFU {flops / ours_s / peak:.1%}  (compile {compile_s:.1f}s, "
    f"loss {ours_loss:.4f}, XLA plans {gib:.2f} GiB)",
    flush=True,
  )
  torch_tps = None
  if not FLAGS.skip_torch:
    torch_s, torch_loss = bench_torch(cfg, tokens, mask, adv)
    torch_tps = n_tok / torch_s
    print(
      f"T={seq:5d} x {batch:3d} rows  torch: {torch_s:.3f} s/step  {torch_tps:10,.0f} "
      f"tokens/s  MFU {flops / torch_s / peak:.1%}  (loss {torch_loss:.4f})  "
      f"ours/torch {torch_s / ours_s:.2f}x",
      flush=True,
    )
  if FLAGS.lora:
    lora_s, _, lora_loss, lora_gib = bench_ours(cfg, tokens, mask, adv, FLAGS.lora)
    print(
      f"T={seq:5d} x {batch:3d} rows  ours LoRA r{FLAGS.lora}: {lora_s:.3f} s/step  "
      f"(loss {lora_loss:.4f}, XLA plans {lora_gib:.2f} GiB)  LoRA/full time "
      f"{lora_s / ours_s:.2f}x, memory {lora_gib / gib:.2f}x",
      flush=True,
    )
    if not FLAGS.skip_torch:
      peft_s, peft_loss = bench_torch(cfg, tokens, mask, adv, FLAGS.lora)
      print(
        f"T={seq:5d} x {batch:3d} rows  torch+PEFT LoRA r{FLAGS.lora}: {peft_s:.3f} s/step "
        f"(loss {peft_loss:.4f})  ours/PEFT {peft_s / lora_s:.2f}x",
        flush=True,
      )
  return n_tok / ours_s, torch_tps


def main(argv):
  del argv
  if FLAGS.onednn:  # before jax starts its CPU client
    os.environ["XLA_FLAGS"] = " ".join(
      filter(None, [os.environ.get("XLA_FLAGS", ""), ONEDNN_XLA_FLAGS])
    )
  import jax
  import jax.numpy as jnp

  from rlvr import model

  cfg = model.ModelConfig(**CONFIGS[FLAGS.model])
  n_params = model.count_params(cfg)
  dt = jnp.float32 if FLAGS.dtype == "float32" else jnp.bfloat16
  shapes = (
    [(max(1, FLAGS.tokens // int(t)), int(t)) for t in FLAGS.seqs]
    if FLAGS.seqs
    else [(FLAGS.batch, FLAGS.seq)]
  )
  print(
    f"model {FLAGS.model}: {n_params / 1e6:.1f}M params; {FLAGS.dtype}; layers "
    f"{'scanned' if FLAGS.scan_layers else 'unrolled'}; backend {jax.default_backend()} "
    f"({jax.device_count()} devices){'; XLA oneDNN dots' if FLAGS.onednn else ''}"
  )
  peak_before = matmul_peak(dt)
  rows = [(seq, *_compare(cfg, batch, seq, peak_before)) for batch, seq in shapes]
  peak = max(peak_before, matmul_peak(dt))  # probed before and after: the higher bounds both
  print(
    f"measured matmul peak ({FLAGS.dtype}): {peak / 1e9:.1f} GFLOP/s (before the steps "
    f"{peak_before / 1e9:.1f}); MFU above is against the before-probe"
  )
  if len(rows) > 1:
    print("\n| T | ours tokens/s | torch tokens/s | ours / torch |\n|---|---|---|---|")
    for seq, ours, torch_tps in rows:
      ratio = f"{ours / torch_tps:.2f}x" if torch_tps else "-"
      print(f"| {seq} | {ours:,.0f} | {f'{torch_tps:,.0f}' if torch_tps else '-'} | {ratio} |")


if __name__ == "__main__":
  app.run(main)
