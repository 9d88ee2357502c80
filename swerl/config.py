"""One typed, strict configuration for the whole pipeline.

Every section forbids unknown keys so that a typo (``dapo.eps_hgih``) fails loudly with its
path instead of silently falling back to a default. Presets live in ``configs/*.yaml`` and
``--set a.b=value`` overrides are parsed as YAML scalars before validation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_PRESET = "cpu-demo-1turn"  # `make demo`'s preset; cpu-demo-multiturn once both its seeds meet the bar


class ConfigError(ValueError):
    """A config problem, always naming the dotted path of the offending key."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Sampling(Strict):
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)  # -1 = off
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    max_new_tokens: int = Field(512, ge=1)
    # End a reply where its first fenced block closes. Not a filter: every kept token is as
    # sampled, the reply is just shorter (one action per reply; the prose a small model adds
    # after its block costs time and, with a second block, a format error).
    stop_at_block: bool = False

    def unbiased_problems(self) -> list[str]:
        """Settings that make the sampler's distribution differ from the policy's.

        The paper's top-k/min-p accident: any filter biases the importance ratio, so training
        rollouts must sample from the raw softmax. A temperature is not a filter: the trainer
        computes its logprobs at the same T (softmax(logits / T) is the policy trained), so the
        ratio stays unbiased; the paper's default is 1.0. Greedy (T=0) has no policy to train.
        """
        bad = []
        if self.temperature <= 0.0:
            bad.append(f"temperature={self.temperature} (must be > 0; the trainer uses the same T)")
        if self.top_p != 1.0:
            bad.append(f"top_p={self.top_p} (must be 1.0)")
        if self.top_k not in (-1, 0):
            bad.append(f"top_k={self.top_k} (must be -1/off)")
        if self.min_p != 0.0:
            bad.append(f"min_p={self.min_p} (must be 0.0)")
        if self.repetition_penalty != 1.0:
            bad.append(f"repetition_penalty={self.repetition_penalty} (must be 1.0)")
        return bad


class ImportSpec(Strict):
    """An upstream collection as one split of the run: imported, run through the paper's filters
    in real containers, and kept in the store under the split's dataset name (reused while this
    spec is unchanged)."""

    source: Literal["swe-bench", "swe-bench-lite", "swe-bench-verified", "swe-rebench", "swe-gym"]
    path: str  # a .json/.jsonl/.parquet file, or a Hugging Face dataset name
    hf_split: str = "test"  # the hub split, for a dataset name
    repo_mirror: str | None = None  # bare mirrors owner__name.git, where GitHub is out of reach
    # a subset by instance id, one per line (e.g. an evaluation subset such as a Verified-50)
    instance_ids_file: str | None = None
    reruns: int = Field(1, ge=0)  # extra gold and empty runs per task for the determinism filter


class DataConfig(Strict):
    train_dataset: str = "synth-train"
    eval_dataset: str = "synth-eval"
    # pin both splits to a dataset's content hash: curation then takes that dataset (from the
    # store, or from the copy shipped in data/datasets/) instead of synthesising, so every machine
    # trains and evaluates on the same tasks (synthesis keeps what passes its time limits, which
    # depends on the machine's speed and load)
    train_hash: str | None = None
    eval_hash: str | None = None
    # imported instead of synthesised (both splits or neither): SWE-rebench / SWE-Gym to train,
    # SWE-bench Verified to evaluate, as the paper does
    train_import: ImportSpec | None = None
    eval_import: ImportSpec | None = None
    tasks_file: str | None = None  # a local tasks.jsonl overriding the dataset store lookup
    eval_tasks_file: str | None = None
    projects_train: list[str] = Field(default_factory=list)  # "name==version"
    projects_eval: list[str] = Field(default_factory=list)
    max_tasks_per_project: int = Field(60, ge=1)
    max_tasks: int | None = Field(None, ge=1)  # cap per split, after the per-project cap
    # how much the issue says (3 = names file and function); applied when tasks are loaded
    # 4: + the wrong line quoted; 5: + its file and line number, not its text (environments/hints.py)
    hint_level: int = Field(1, ge=0, le=5)
    # drop tasks that cannot be stated at hint_level (levels 4-5 need a one-line bug; by default
    # such tasks stay, stated at level 3)
    exact_hint_level: bool = False
    # curriculum: keep only synthesised bugs of these kinds (both splits; None = all kinds)
    modifiers: list[str] | None = None
    determinism_runs: int = Field(3, ge=1)
    # synthesis effort: seconds per project, and one full-suite run per kept bug for exact
    # FAIL_TO_PASS/PASS_TO_PASS (off: inferred from the call trace, ~3x faster)
    synth_time_budget_s: int = Field(1800, ge=1)
    full_suite_check: bool = True
    max_patch_files: int = Field(7, ge=1)
    max_patch_lines: int = Field(500, ge=1)
    max_failing_share: float = Field(0.5, gt=0.0, le=1.0)
    seed: int = 0

    def pinned_hash(self, split: str) -> str | None:
        """The content hash the config pins `split` ("train" or "eval") to; None when unpinned."""
        if split not in ("train", "eval"):
            raise ValueError(f"no dataset split {split!r}: 'train' or 'eval'")
        return self.train_hash if split == "train" else self.eval_hash

    @model_validator(mode="after")
    def _imports_together(self) -> "DataConfig":
        if (self.train_import is None) != (self.eval_import is None):
            raise ValueError("data.train_import and data.eval_import go together: set both or neither")
        if self.train_import and (self.train_hash or self.eval_hash):
            raise ValueError("data.*_import and data.*_hash exclude each other: an imported split is pinned by its spec")
        return self

    @model_validator(mode="after")
    def _pins_together(self) -> "DataConfig":
        if (self.train_hash is None) != (self.eval_hash is None):
            raise ValueError("data.train_hash and data.eval_hash pin the datasets together: set both or neither")
        if self.train_hash and (self.tasks_file or self.eval_tasks_file):
            raise ValueError("data.train_hash/eval_hash pin store datasets; data.tasks_file/eval_tasks_file "
                             "name files instead: use one or the other")
        return self


class EnvironmentConfig(Strict):
    sandbox: Literal["docker", "local"] = "docker"
    base_image: str = "swerl-base"
    cpus: float = Field(1.0, gt=0)
    memory: str = "1g"
    pids_limit: int = Field(256, ge=16)
    command_timeout_s: float = Field(30.0, gt=0)
    test_timeout_s: float = Field(300.0, gt=0)
    output_cap_bytes: int = Field(16_000, ge=256)
    window: int = Field(100, ge=1)  # lines shown by the file viewer (curricula show fewer)


class VLLMEngineConfig(Strict):
    """The in-process vLLM engine (rollout.backend=vllm): what it must be told on each machine."""

    # skip torch.compile and graph capture: on 2 CPU cores the engine starts in ~50 s, not ~150 s
    enforce_eager: bool = True
    # KV cache size; None = vLLM's own sizing, which on CPU wants 92% of the machine's memory
    # and refuses to start beside containers and a trainer
    kv_cache_gib: float | None = Field(2.0, gt=0)
    # off: per-request seeds with a chunked prefill crash the CPU engine ("CPU Generator does not
    # use offset"); whole-prompt prefills keep every seeded row reproducible
    chunked_prefill: bool = False
    max_num_seqs: int | None = Field(None, ge=1)  # requests batched at once; None = vLLM's default
    # tokens per KV block, the prefix cache's unit: a prompt's last partial block is computed again
    # on every turn. None = vLLM's choice (128 on CPU); on CPU a multiple of 32 (docs/DEMO.md)
    block_size: int | None = Field(None, ge=1)


class RolloutConfig(Strict):
    backend: Literal["hf", "openai", "vllm"] = "hf"
    vllm: VLLMEngineConfig = Field(default_factory=VLLMEngineConfig)  # for backend=vllm
    model: str = "default"  # "default" = the cached SmolLM2-135M-Instruct
    server_url: str | None = None  # for backend=openai
    # "auto": bfloat16 where the device has bf16 units, else float32 (training/precision.py)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    # compute threads while generating: torch's (hf), the CPU engine's OpenMP threads (vllm). None: half
    # the cores (hf), vLLM's own choice (all but one core, kept for its scheduler)
    infer_threads: int | None = Field(None, ge=1)
    max_turns: int = Field(10, ge=1)
    max_context_tokens: int = Field(4096, ge=256)
    observation_max_chars: int = Field(4000, ge=100)
    samples_per_task: int = Field(2, ge=1)
    concurrency: int = Field(4, ge=1)  # sandboxes at once
    one_shot_demo: bool = False  # every stage's prompts start with the worked example
    action_format: Literal["tools", "tools+file"] = "tools+file"
    # "short": one instruction, no tool manual (what a 135M model can follow); "full": SWE-agent's;
    # "line": short, answered with the corrected line (needs hint level 4, which quotes it)
    prompt_style: Literal["full", "short", "line"] = "full"
    # the first observation shows the function a hint-level-3 issue names, as if opened
    show_source: bool = False
    # "tests": after each change the environment runs the task's failing tests in the agent's
    # sandbox and shows their output; a pass ends the episode (environments/feedback.py). Only for
    # tasks whose tests the agent can see (no hidden test_patch)
    feedback: Literal["none", "tests"] = "none"
    sampling: Sampling = Field(default_factory=Sampling)
    seed: int = 0


REPO_DIR = CONFIG_DIR.parent
# accelerate distributions the trainer runs: one process, DDP, FSDP (DeepSpeed keeps its optimizer
# inside its engine, out of reach of the state that DAPO carries from one update to the next)
LAUNCHABLE = ("NO", "MULTI_CPU", "MULTI_GPU", "FSDP")


def accelerate_file(path: str) -> Path:
    """An accelerate config path as written in a preset: absolute, or relative to the repo root."""
    p = Path(path)
    return p if p.is_absolute() else REPO_DIR / p


def accelerate_distribution(path: str) -> str:
    """The `distributed_type` of an accelerate config file, which must exist and be launchable."""
    f = accelerate_file(path)
    if not f.is_file():
        raise ValueError(f"accelerate_config {path!r}: no such file (looked at {f})")
    kind = str((yaml.safe_load(f.read_text()) or {}).get("distributed_type", "NO"))
    if kind not in LAUNCHABLE:
        raise ValueError(f"accelerate_config {path!r}: distributed_type {kind} is not one of {', '.join(LAUNCHABLE)}")
    return kind


class TrainerConfig(Strict):
    """How the optimizer runs; what it learns from (lr, batch) is set per stage."""

    micro_batch_tokens: int = Field(4096, ge=128)
    warmup_ratio: float = Field(0.1, ge=0, le=1)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    gradient_checkpointing: bool = True
    dtype: Literal["auto", "float32", "bfloat16"] = "float32"  # bf16 = autocast; auto as rollout.dtype
    # None or "single": the update runs in the pipeline's own process (a laptop). A path
    # (infra/accelerate/fsdp.yaml): it runs as an `accelerate launch` process group of that config
    accelerate_config: str | None = None
    # processes in that group; None: one per gpu.train_devices under layout split, else the file's
    num_processes: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _launchable(self) -> "TrainerConfig":
        if self.accelerate_config not in (None, "single"):
            accelerate_distribution(self.accelerate_config)  # raises on a missing or unusable file
        return self

    @property
    def in_process(self) -> bool:
        return self.accelerate_config in (None, "single")


class SFTConfig(TrainerConfig):
    """RFT's supervised fine-tune: what it learns from (lr, batch, epochs) plus how it runs."""

    lr: float = Field(5e-6, gt=0)
    batch_size: int = Field(8, ge=1)
    epochs: int = Field(1, ge=1)


class RFTConfig(Strict):
    enabled: bool = True
    samples_per_task: int = Field(10, ge=1)
    one_shot_demo: bool = True
    max_tasks: int | None = None
    # Collection sampler (default: rollout.sampling). Rejection sampling trains on the kept
    # episodes as plain SFT targets, with no importance ratio, so a cooler sampler is allowed
    # here: it buys more resolved episodes from a weak base model.
    sampling: Sampling | None = None
    # The collection's own curriculum (None: data.hint_level, rollout.show_source, rollout.max_turns):
    # collect where the base policy resolves (e.g. the line quoted, one turn), then run DAPO and
    # evaluation where it must be looked up (docs/DEMO.md, multi-turn)
    hint_level: int | None = Field(None, ge=0, le=5)
    show_source: bool | None = None
    max_turns: int | None = Field(None, ge=1)
    train: SFTConfig = Field(default_factory=SFTConfig)


class DAPOStage(Strict):
    iterations: int = Field(1, ge=0)
    problems_per_iteration: int = Field(8, ge=1)
    group_size: int = Field(10, ge=2)
    eps_low: float = Field(0.2, ge=0, le=1)
    eps_high: float = Field(0.28, ge=0)
    lr: float = Field(1e-6, gt=0)
    batch_size: int = Field(128, ge=1)  # trajectories per optimizer step
    max_turns: int = Field(40, ge=1)
    max_context_tokens: int = Field(65536, ge=256)
    l_thr: int = Field(10, ge=1)
    kl_coef: float = Field(0.0, ge=0)
    filter_solved_share: float | None = None  # stage 2: drop tasks solved >= this share
    drop_never_solved: bool = False
    # DAPO's dynamic sampling (Yu et al. 2025): while fewer than `min_groups_kept` groups have a
    # nonzero advantage, draw `problems_per_extra_draw` (None: `problems_per_iteration`) more
    # unseen problems, up to `max_problems_per_iteration` in all (None: no second draw). A smaller
    # extra draw stops nearer the groups wanted: one group short costs that many problems, not a batch
    min_groups_kept: int = Field(0, ge=0)
    max_problems_per_iteration: int | None = Field(None, ge=1)
    problems_per_extra_draw: int | None = Field(None, ge=1)
    # the update's batch in groups (None: every group with a gradient): DAPO fills a batch of fixed
    # size and sets the rest aside; the first ones drawn are kept, whatever order episodes end in
    max_groups_kept: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _thresholds(self) -> "DAPOStage":
        if self.l_thr > self.max_turns:  # equal: no episode is ever penalised (one-turn curricula)
            raise ValueError(f"l_thr ({self.l_thr}) must not exceed max_turns ({self.max_turns})")
        cap = self.max_problems_per_iteration
        if cap is not None and cap < self.problems_per_iteration:
            raise ValueError(f"max_problems_per_iteration ({cap}) is below problems_per_iteration "
                             f"({self.problems_per_iteration})")
        if self.min_groups_kept and cap is None:
            raise ValueError("min_groups_kept needs max_problems_per_iteration (the most problems an "
                             "iteration may draw), or it could never draw a second time")
        if self.max_groups_kept is not None and self.max_groups_kept < self.min_groups_kept:
            raise ValueError(f"max_groups_kept ({self.max_groups_kept}) is below min_groups_kept "
                             f"({self.min_groups_kept})")
        if self.problems_per_extra_draw is not None and not self.min_groups_kept:
            raise ValueError("problems_per_extra_draw needs min_groups_kept: without it no iteration "
                             "draws a second time")
        return self


class DAPOConfig(Strict):
    enabled: bool = True
    stages: list[DAPOStage] = Field(default_factory=lambda: [DAPOStage()])
    adv_delta: float = Field(1e-6, gt=0)
    logprob_chunk: int = Field(1024, ge=16)
    mismatch_warn_kl: float = Field(0.05, gt=0)
    tis_cap: float | None = None  # truncated importance-sampling correction, off by default
    # pi_old in the ratio: "trainer" rescores the samples with the weights the engine was given
    # (one forward pass over them); "sampler" takes the engine's own logprobs, no pass, sound
    # where both compute alike (the mismatch/* metrics, from the first step, say how alike)
    old_logprobs: Literal["trainer", "sampler"] = "trainer"
    train: TrainerConfig = Field(default_factory=TrainerConfig)

    @model_validator(mode="after")
    def _check(self) -> "DAPOConfig":
        if self.old_logprobs == "sampler" and self.tis_cap is not None:
            raise ValueError("tis_cap reweights the trainer's old logprobs toward the sampler's; with "
                             "old_logprobs: sampler the ratio is already taken against the sampler")
        return self


class DifficultyConfig(Strict):
    enabled: bool = True
    samples_per_task: int = Field(4, ge=1)
    min_pass_rate: float = Field(0.0, ge=0, le=1)
    max_pass_rate: float = Field(1.0, ge=0, le=1)


class EvalConfig(Strict):
    runs: int = Field(10, ge=1)
    max_tasks: int | None = None
    k: list[int] = Field(default_factory=lambda: [1, 5])
    sampling: Sampling = Field(default_factory=Sampling)
    significance: float = Field(0.05, gt=0, lt=1)
    # the pipeline also evaluates every DAPO checkpoint before the last (labelled by name), for
    # the report's Pass@1 per iteration; off, only the final one ("dapo")
    each_dapo_checkpoint: bool = False
    # a champion evaluated on another eval set (curation refreshed it) is evaluated again on this
    # run's set before the paired test; off, such a challenger is "not comparable" and stays out
    rebaseline_champion: bool = True


class GPUConfig(Strict):
    """Where vLLM and the trainer run on a GPU node (training/layout.py reads it).

    shared: everything on the devices the process sees, nothing handed over (CPU, one small GPU).
    split: vLLM on `rollout_devices` (tensor parallel over them), the trainer's process group on
    `train_devices`, one process each. colocate: both on every device; vLLM sleeps (weights to
    host memory, KV cache freed) while the trainer updates, and wakes for the next rollouts.
    """

    layout: Literal["shared", "split", "colocate"] = "shared"
    rollout_devices: list[int] = Field(default_factory=list)
    train_devices: list[int] = Field(default_factory=list)
    tensor_parallel: int = Field(1, ge=1)  # vLLM's tensor_parallel_size
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)  # vLLM's share of each of its devices
    max_model_len: int | None = Field(None, ge=256)  # vLLM's context; None: the model's
    # long context beyond the model's native window, in transformers' and vLLM's `rope_parameters`
    # shape, e.g. Qwen2.5's YaRN: {rope_type: yarn, factor: 4.0, original_max_position_embeddings:
    # 32768, rope_theta: 1000000.0}; vLLM and the trainer get the same, or the trainer's logprobs
    # are of another policy than the one sampled
    rope_parameters: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _devices_fit_layout(self) -> "GPUConfig":
        if self.layout == "split":
            if not self.rollout_devices or not self.train_devices:
                raise ValueError("layout split needs rollout_devices and train_devices")
            if set(self.rollout_devices) & set(self.train_devices):
                raise ValueError(f"layout split: rollout_devices {self.rollout_devices} and train_devices "
                                 f"{self.train_devices} overlap")
            if self.tensor_parallel != len(self.rollout_devices):
                raise ValueError(f"layout split: tensor_parallel ({self.tensor_parallel}) must equal the number of "
                                 f"rollout_devices ({len(self.rollout_devices)})")
        elif self.rollout_devices or self.train_devices:
            raise ValueError(f"layout {self.layout} uses every visible device: rollout_devices/train_devices "
                             "are for layout split")
        if self.rope_parameters is not None and not {"rope_type", "rope_theta"} <= set(self.rope_parameters):
            raise ValueError("rope_parameters needs rope_type (e.g. yarn) and rope_theta (the model's, e.g. 1000000.0)")
        return self


class OrchestrationConfig(Strict):
    prefect_api_url: str | None = None  # None = Prefect's ephemeral API
    cpu_pool: str = "swerl-cpu"
    gpu_pool: str = "swerl-gpu"
    sandbox_limit: int = Field(8, ge=1)
    gpu_limit: int = Field(1, ge=1)
    retries: int = Field(3, ge=0)
    retry_delay_s: float = Field(10.0, ge=0)


class StorageConfig(Strict):
    uri: str = "file://.swerl/store"
    s3_endpoint_url: str | None = None
    s3_key: str | None = None  # env AWS_ACCESS_KEY_ID wins when unset
    s3_secret: str | None = None
    retry_s: float = Field(120.0, ge=0)  # how long a storage outage is retried before failing


class TrackingConfig(Strict):
    uri: str = "sqlite:///.swerl/mlflow.db"
    experiment: str | None = None  # default: swerl-{preset}
    registered_model: str = "swerl-agent"
    retry_s: float = Field(120.0, ge=0)


class SwerlConfig(Strict):
    preset: str = "custom"
    seed: int = 0
    data: DataConfig = Field(default_factory=DataConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    difficulty: DifficultyConfig = Field(default_factory=DifficultyConfig)
    rft: RFTConfig = Field(default_factory=RFTConfig)
    dapo: DAPOConfig = Field(default_factory=DAPOConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    gpu: GPUConfig = Field(default_factory=GPUConfig)
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @model_validator(mode="after")
    def _training_sampling_is_unbiased(self) -> "SwerlConfig":
        bad = self.rollout.sampling.unbiased_problems()
        if bad:
            raise ValueError(
                "rollout.sampling: training rollouts must sample from the unfiltered policy: "
                + ", ".join(bad)
            )
        return self

    def rft_collection(self) -> "SwerlConfig":
        """This config as the RFT collection runs it: rft.hint_level/show_source/max_turns in place
        of data's and rollout's, checked by the same rules (a bad combination fails at load)."""
        r = self.rft
        if r.hint_level is None and r.show_source is None and r.max_turns is None:
            return self
        tree = self.model_dump()
        tree["rft"].update(hint_level=None, show_source=None, max_turns=None)
        for section, key, value in (("data", "hint_level", r.hint_level), ("rollout", "show_source", r.show_source),
                                    ("rollout", "max_turns", r.max_turns)):
            if value is not None:
                tree[section][key] = value
        try:
            return SwerlConfig.model_validate(tree)
        except ValidationError as err:
            raise ValueError(f"rft.hint_level/show_source/max_turns: the RFT collection's settings are invalid: "
                             f"{err.errors()[0]['msg']}") from None

    @model_validator(mode="after")
    def _rft_collection_is_valid(self) -> "SwerlConfig":
        self.rft_collection()
        return self

    @model_validator(mode="after")
    def _line_style_has_a_line_to_fix(self) -> "SwerlConfig":
        d, r = self.data, self.rollout
        if r.prompt_style != "line":
            return self
        # level 4: the quoted line is the code to correct, in the file show_source opens;
        # level 5: the agent opens the pointed-at line itself (rollout.show_source false)
        pointer = d.hint_level == 5
        if d.hint_level not in (4, 5) or not d.exact_hint_level or r.action_format != "tools+file" \
                or r.show_source == pointer:
            raise ValueError("rollout.prompt_style: 'line' asks for the corrected version of the line the issue points "
                             "at: it needs data.exact_hint_level true, rollout.action_format 'tools+file', and either "
                             "data.hint_level 4 (the line quoted) with rollout.show_source true, or data.hint_level 5 "
                             "(its file and number) with rollout.show_source false (the agent opens it)")
        return self

    @model_validator(mode="after")
    def _layout_fits_the_parts(self) -> "SwerlConfig":
        g = self.gpu
        longest = max([self.rollout.max_context_tokens] + [st.max_context_tokens for st in self.dapo.stages])
        if g.max_model_len is not None and g.max_model_len < longest:
            raise ValueError(f"gpu.max_model_len ({g.max_model_len}) is below the longest context an episode may "
                             f"reach ({longest}, rollout/dapo max_context_tokens)")
        if g.layout == "colocate" and self.rollout.backend != "vllm":
            raise ValueError(f"gpu.layout colocate hands memory over by vLLM's sleep/wake: it needs rollout.backend "
                             f"vllm, not {self.rollout.backend}")
        if g.layout == "split":
            for name, train in (("rft.train", self.rft.train), ("dapo.train", self.dapo.train)):
                if train.in_process:
                    raise ValueError(f"gpu.layout split runs the trainer on its own devices: {name}.accelerate_config "
                                     "must name an accelerate config (e.g. infra/accelerate/fsdp.yaml)")
                if train.num_processes not in (None, len(g.train_devices)):
                    raise ValueError(f"{name}.num_processes ({train.num_processes}) must be one per "
                                     f"gpu.train_devices ({len(g.train_devices)})")
        return self

    @property
    def experiment_name(self) -> str:
        return self.tracking.experiment or f"swerl-{self.preset}"


def _format_error(err: ValidationError, source: str) -> ConfigError:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"{path}: unknown key")
        elif path:
            lines.append(f"{path}: {e['msg']}")
        else:
            lines.append(e["msg"])
    return ConfigError(f"invalid config ({source}):\n  " + "\n  ".join(lines))


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.0.c` in a nested dict/list tree; list items are addressed by index."""
    keys = dotted.split(".")
    node: Any = tree
    for i, k in enumerate(keys):
        last = i == len(keys) - 1
        where = ".".join(keys[: i + 1])
        if isinstance(node, list):
            if not k.isdigit() or int(k) >= len(node):
                raise ConfigError(f"{where}: no such list item (length {len(node)})")
            if last:
                node[int(k)] = value
            else:
                node = node[int(k)]
        elif isinstance(node, dict):
            if last:
                node[k] = value
            else:
                if node.get(k) is None:
                    node[k] = {}
                node = node[k]
        else:
            raise ConfigError(f"{'.'.join(keys[:i])}: is not a section, cannot set {dotted}")


def parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"--set expects key=value, got {item!r}")
    key, raw = item.split("=", 1)
    return key.strip(), yaml.safe_load(raw) if raw.strip() else ""


def preset_path(name: str) -> Path:
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    p = CONFIG_DIR / f"{name}.yaml"
    if not p.exists():
        known = ", ".join(sorted(x.stem for x in CONFIG_DIR.glob("*.yaml")))
        raise ConfigError(f"unknown preset {name!r} (known: {known})")
    return p


def load_config(preset: str = "smoke", overrides: list[str] | None = None) -> SwerlConfig:
    """Resolve a preset (name or YAML path) plus ``a.b=value`` overrides into a SwerlConfig."""
    path = preset_path(preset)
    tree = yaml.safe_load(path.read_text()) or {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    tree.setdefault("preset", path.stem)
    for item in overrides or []:
        key, value = parse_override(item)
        _set_path(tree, key, value)
    try:
        return SwerlConfig.model_validate(tree)
    except ValidationError as err:
        raise _format_error(err, str(path)) from None


def config_from_dict(tree: dict[str, Any], source: str = "dict") -> SwerlConfig:
    try:
        return SwerlConfig.model_validate(tree)
    except ValidationError as err:
        raise _format_error(err, source) from None


def dump_config(cfg: SwerlConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def flat_params(cfg: SwerlConfig) -> dict[str, str]:
    """The resolved config as flat ``a.b.c -> str`` pairs, for tracking params."""
    out: dict[str, str] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(node, list) and node and all(isinstance(x, dict) for x in node):
            for i, v in enumerate(node):
                walk(f"{prefix}.{i}", v)
        else:
            out[prefix] = str(node)

    walk("", cfg.model_dump(mode="json"))
    return out
