"""Qwen2.5-32B on DAPO-17k (SvS paper's RLVR baseline: 600 steps).

Hyper-parameters: SvS public settings (METHODS.md): lr 1e-6 constant, weight
decay 0.01, 256 prompts x 8 responses per step (one optimizer step per rollout
batch), clip 0.2 / 0.28, dual-clip 3, token-mean loss, no KL, grad clip 1.0,
temperature 1.0, prompt 4096 / response 8192 tokens. Nothing is downloaded:

  python -m launch.train --config=configs/rlvr_dapo17k_qwen25_32b.py \
      --config.model.path=/path/to/hf_model --config.data.train_path=/path/to/train.parquet \
      --config.sampler.urls=http://10.0.0.2:8000,http://10.0.0.3:8000 --workdir=runs/rlvr_dapo17k_qwen25_32b
"""

from configs import base


def get_config():
  c = base.get_config()
  c.workdir = "runs/rlvr_dapo17k_qwen25_32b"
  c.model.path = ""                     # required: HF dir of the base model
  c.data.kind = "files"
  c.data.train_path = "../shared/data/dapo_math_17k.parquet"   # verl layout
  c.data.eval_paths = ["../shared/data/math_aime_eval.jsonl"]
  c.sampler.kind = "vllm"               # servers started with launch/serve_vllm.py --device=gpu
  c.mesh = {"data": 1, "fsdp": 8, "tensor": -1}
  c.rl.steps = 600
  c.reward = {"extraction": "boxed", "integer_answers": True, "format_bonus": 0.0,
              "timeout_s": 5.0}
  c.eval.sampling = {"n": 32, "seeds": (0,), "temperature": 1.0, "top_p": 0.7,
                     "max_tokens": 8192, "batch_prompts": 256}
  return c
