"""Every field of an rlvr experiment, with the GRPO defaults shared by the papers.

Experiment configs start from `get_config()` here and override what differs.
Numbers: METHODS.md "GRPO as used by all three" (SvS public settings).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.workdir = "workdir/run"             # everything of the run goes here; rerun to resume
  c.seed = 0
  c.coordinator = ""                    # multi-host: "host:port" or "auto"; "" = one process
  c.mesh = {"data": 1, "fsdp": -1, "tensor": 1}   # -1: all remaining devices
  c.export_hf = True                    # write the final policy as an HF dir (workdir/policy)
  c.reward_workers = 8                  # math-verify processes

  c.model = ml_collections.ConfigDict()
  c.model.path = ""                     # HF dir of the policy; "" = build a tiny random model
  c.model.cache_dir = "~/.cache/rlvr"   # where tiny models are cached
  c.model.tiny = {}                     # make_tiny overrides when model.path is ""

  c.sampler = ml_collections.ConfigDict()
  c.sampler.kind = "jax"                # "jax" (in-process) or "vllm" (servers at urls)
  c.sampler.urls = []                   # vLLM servers, each started (launch/serve_vllm.py) from
                                        # an untied copy of the policy
  c.sampler.sync_dtype = "bfloat16"     # dtype of the weights pushed to vLLM
  c.sampler.max_concurrency = 64        # in-flight requests per process

  c.data = ml_collections.ConfigDict()
  c.data.kind = "files"                 # "files" or "arithmetic" (procedural)
  c.data.instruction = "Please reason step by step, and put your final answer within \\boxed{}."
  c.data.arithmetic = {"difficulty": 1, "max_operand": 20, "n_sft": 0, "n_train": 0,
                       "n_heldout": 0, "inverse_pairs": False}
  c.data.train_path = ""                # parquet (verl) / jsonl / json
  c.data.eval_paths = []                # evaluated before and after RL
  c.data.sft_path = ""                  # rows with a `solution` for the SFT warm start
  c.data.problem_field = ""             # "" = auto (problem/question/prompt)
  c.data.answer_field = ""              # "" = auto (answer/ref_answer/ground_truth)
  c.data.on_bad_row = "skip"            # or "error"

  c.sft = ml_collections.ConfigDict()
  c.sft.steps = 0                       # 0 = no SFT warm start
  c.sft.batch_size = 64
  c.sft.learner = {"learning_rate": 1e-5, "weight_decay": 0.0, "dual_clip": None}

  c.method = "rlvr"                     # "rlvr" (plain GRPO) or "svs" (online synthesis)
  c.svs = {                             # synthesis.svs.SvSConfig (METHODS.md "SvS")
      "under_lo": 0.125, "under_hi": 0.5,       # underperforming band (SvS-Asp: 0.375..0.75)
      "reward_lo": 0.125, "reward_hi": 0.625,   # synthesis reward band
      "naive_reward": False,                    # ablation: reward any solvable synthesis
      "syntheses_per_solution": 8,              # G_v
      "type2_keep_ratio": 1.0,                  # ablation: 0.2
      "max_problem_chars": 4000,
      "mode": "svs",                            # "eup": second rollout instead of synthesis
  }
  c.svs_template = "default"            # synthesis prompt: "default", "arithmetic" or a file path

  c.rl = ml_collections.ConfigDict()
  c.rl.steps = 500
  c.rl.loop = {"prompts_per_step": 256, "group_size": 8, "max_prompt_len": 4096,
               "max_response_len": 8192, "temperature": 1.0, "top_p": 1.0,
               "dynamic_sampling": True, "max_extra_rounds": 3, "oversample": 2.0}
  c.rl.learner = {"learning_rate": 1e-6, "lr_schedule": "constant", "weight_decay": 0.01,
                  "grad_clip": 1.0, "eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0,
                  "aggregation": "token-mean", "kl_beta": 0.0, "micro_batches": 16,
                  "remat": True, "compute_dtype": "bfloat16"}

  c.reward = {"extraction": "boxed", "integer_answers": False, "format_bonus": 0.0,
              "timeout_s": 5.0}

  c.eval = ml_collections.ConfigDict()
  c.eval.every = 0                      # also evaluate every N GRPO steps (0 = before/after only)
  c.eval.sampling = {"n": 8, "seeds": (0,), "temperature": 1.0, "top_p": 0.7,
                     "max_tokens": 8192, "batch_prompts": 128}

  c.checkpoint = {"every": 20, "keep": 3}
  return c


def paper(name: str, *, steps: int, method: str = "rlvr", train_path: str = "",
          integer_answers: bool = False, fsdp: int = 4) -> ml_collections.ConfigDict:
  """A paper-scale run: SvS public GRPO settings, vLLM sampling, MATH/AIME evaluation.

  GRPO: lr 1e-6 constant, weight decay 0.01, 256 prompts x 8 responses per step
  (one optimizer step per rollout batch), clip 0.2 / 0.28, dual-clip 3, token-mean
  loss, no KL, grad clip 1.0, temperature 1.0, prompt 4096 / response 8192 tokens.
  With method="svs": underperforming 12.5%..50%, G_v 8, synthesis reward band
  12.5%..62.5% (ablations: configs/svs_ablations.py). All from METHODS.md.
  Model and (unless given) data paths are left for flags; nothing is downloaded.
  """
  c = get_config()
  c.workdir = f"runs/{name}"
  c.method = method
  c.model.path = ""                     # required: HF dir of the base model
  c.data.kind = "files"
  c.data.train_path = train_path        # required if "": verl parquet / jsonl / json
  c.data.eval_paths = ["../shared/data/math_aime_eval.jsonl"]
  c.sampler.kind = "vllm"               # servers: launch/serve_vllm.py --device=gpu
  c.mesh = {"data": 1, "fsdp": fsdp, "tensor": -1}
  c.rl.steps = steps                    # MATH-12k runs: 300 steps; 32B on DAPO-17k: 600
  c.reward = {"extraction": "boxed", "integer_answers": integer_answers, "format_bonus": 0.0,
              "timeout_s": 5.0}
  c.eval.sampling = {"n": 32, "seeds": (0,), "temperature": 1.0, "top_p": 0.7,
                     "max_tokens": 8192, "batch_prompts": 256}
  return c
