"""The training sections of the job spec: objective, sampling, optimiser, resources, checkpoints, traces,
trackers, async, evaluation and IBPO."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rlcore import list_objectives, resolve
from tgc_rl.config.base import (
    MAX_GROUP_SIZE,
    MAX_NEW_TOKENS,
    MAX_PROMPTS_PER_STEP,
    MAX_REPLICAS,
    MAX_STEPS,
    _free_form,
    _Strict,
)
from tgc_rl.tasks.dataset import DatasetParams
from tgc_rl.tasks.params import check_template


class ObjectiveSpec(_Strict):
    """The policy-gradient objective (an rlcore preset) and knob overrides."""

    name: str = Field("cp_grpo", description="An rlcore preset; see `rlcore.list_objectives()`.")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="Preset knob overrides, e.g. {kl_coef: 0.01, clip_high: 0.28}."
    )
    _check_overrides = field_validator("overrides", mode="before")(_free_form("objective.overrides"))

    @field_validator("name")
    @classmethod
    def _known_objective(cls, v: str) -> str:
        names = list_objectives()
        if v not in names:
            raise ValueError(f"unknown objective {v!r}; choose one of: {', '.join(names)}")
        return v

    @field_validator("overrides")
    @classmethod
    def _valid_overrides(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # rlcore's knob ranges and combinations, checked where the spec is parsed (torch-free)
        if "name" not in info.data:  # a bad name is reported on its own
            return v
        resolve(info.data["name"], v)
        return v


class OverlongSpec(_Strict):
    """Responses cut at max_new_tokens, handled before centring so every group still sums to 0
    (docs/objectives.md#overlong-responses)."""

    mode: Literal["none", "shape", "filter"] = Field(
        "none",
        description="none: truncated responses train like any other; shape: DAPO's soft overlong penalty added "
        "to the reward (0 up to max_new_tokens - buffer, then down to -factor); filter: truncated responses "
        "leave the centring (advantage 0, the group recentred over the rest; a group left with < 2 gets 0).",
    )
    buffer: int | None = Field(
        None, ge=1, le=MAX_NEW_TOKENS, description="shape: the ramp before max_new_tokens, in tokens."
    )
    factor: float = Field(1.0, gt=0, le=10, description="shape: the penalty at max_new_tokens (-factor).")

    @model_validator(mode="after")
    def _buffer_for_shape(self) -> OverlongSpec:
        if (self.mode == "shape") != (self.buffer is not None):
            raise ValueError(
                "sampling.overlong.buffer: required with mode 'shape' (the penalty's ramp in tokens) and only "
                "then; set it, or remove it"
            )
        return self


class SamplingSpec(_Strict):
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature of the rollout engine.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(64, ge=1, le=MAX_NEW_TOKENS, description="Response length budget.")
    max_prompt_tokens: int = Field(256, ge=8, le=MAX_NEW_TOKENS, description="Longer prompts are refused.")
    overlong: OverlongSpec = Field(
        default_factory=OverlongSpec, description="Truncated responses: shaped or filtered before centring."
    )

    @model_validator(mode="after")
    def _overlong_buffer(self) -> SamplingSpec:
        if (self.overlong.buffer or 0) > self.max_new_tokens:
            raise ValueError(
                f"sampling.overlong.buffer ({self.overlong.buffer}) exceeds sampling.max_new_tokens "
                f"({self.max_new_tokens}); lower it"
            )
        return self


class OptimSpec(_Strict):
    lr: float = Field(1e-5, gt=0, le=1, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, le=1)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.999), description="AdamW's moment decay rates, each in [0, 1)."
    )
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS, description="Linear warm-up length in optimizer steps.")
    schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="LR after warm-up.")
    grad_clip: float = Field(1.0, gt=0, le=1e6, description="Max global grad norm.")
    micro_batch_size: int = Field(8, ge=1, le=4096, description="Sequences per forward/backward per rank.")
    micro_batch_tokens: int | None = Field(
        None,
        ge=16,
        le=1_048_576,
        description="Also at most this many tokens per forward/backward per rank, padding included, counted as "
        "the forward computes them (with shared_prompt_forward each group's prompt once); a group is never "
        "split, so one group larger than this runs alone. With shared prompts a row costs a fraction of its "
        "length, so a token budget with a large micro_batch_size makes fewer, larger (faster) micro-batches "
        "than a row count sized for one forward per row. null: rows only.",
    )
    ppo_epochs: int = Field(1, ge=1, le=16, description="Optimizer passes over each rollout batch.")
    mini_batches: int = Field(
        1, ge=1, le=256, description="Optimizer steps per epoch; groups are never split across them."
    )
    logprob_chunk_tokens: int = Field(
        1024,
        ge=16,
        le=1_048_576,
        description="Tokens per chunk when computing log-probs (the T x vocab logits never exist whole).",
    )
    activation_checkpointing: bool = Field(False, description="Recompute activations in backward.")
    shared_prompt_forward: bool = Field(
        True,
        description="Compute each group's prompt (and any response prefix its rows share) once per "
        "micro-batch, as one token tree with a tree attention mask (Prefix Grouper, arXiv 2506.05433): the same "
        "gradients as one forward per row, with shared tokens' log-probs bit-identical across the group. Used where "
        "the model supports it (Llama/Mistral/Qwen2/Qwen3 with SDPA or eager attention, no sliding window); "
        "false: one forward per row.",
    )
    dense_tree_max_tokens: int | None = Field(
        None,
        ge=0,
        le=1_048_576,
        description="With shared_prompt_forward: token trees of at most this many nodes (per micro-batch, padded) "
        "use a dense L x L attention mask; longer ones a tree kernel whose memory grows linearly "
        "(tgc_rl/learner/tree_attention.py; SDPA models: a block kernel on CPU, FlexAttention on CUDA). "
        "null: by device, where each was measured faster (1024 on a CPU, 0 on CUDA); 0: always the kernel; "
        "1048576: always dense.",
    )


# Ray custom resources an actor asks for, by name: they choose nodes (tgc_rl/control/policy.py bounds who may)
CustomResources = dict[
    Annotated[str, Field(min_length=1, max_length=128)], Annotated[float, Field(ge=0, le=1e6)]
]


class ResourceSpec(_Strict):
    learner_ranks: int = Field(1, ge=1, le=MAX_REPLICAS, description="FSDP2 ranks (one Ray actor each).")
    rollout_replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="Generation engines (Ray actors).")
    cpus_per_learner: float = Field(1, ge=0, le=1024)
    gpus_per_learner: float = Field(0, ge=0, le=64)
    cpus_per_rollout: float = Field(1, ge=0, le=1024)
    gpus_per_rollout: float = Field(0, ge=0, le=64)
    rollout_engine: Literal["auto", "vllm", "hf"] = Field(
        "auto",
        description="`vllm` (CPU or CUDA backend), `hf` (transformers generate), `auto`: vllm if installed.",
    )
    vllm_memory_fraction: float = Field(
        0.08,
        gt=0,
        le=0.95,
        description="vLLM gpu_memory_utilization; on CPU the share of host RAM for KV cache.",
    )
    weight_sync: Literal["object_store", "broadcast"] = Field(
        "object_store",
        description="How each step's weights reach the replicas. `object_store`: learner rank 0 puts "
        "one flat buffer into Ray's object store and every replica loads it in place (any engine, any placement). "
        "`broadcast`: the learner sends tensor by tensor straight into every vLLM replica through vLLM's "
        "weight-transfer API: NCCL between GPUs (no host round trip), gloo on CPU; needs rollout_engine vllm. A "
        "replica restarted after a failure gets the current weights through the object store and the group is rebuilt.",
    )
    rollout_sharing: Literal["own", "shared"] = Field(
        "own",
        description="`own`: the job starts its own rollout replicas. `shared` (LoRA jobs, vLLM): the job's "
        "adapter is served by one detached vLLM engine per base model and engine settings, which the LoRA jobs "
        "on that base share (one copy of the base weights; docs/lora.md); needs model.lora, rollout_engine vllm "
        "or auto, weight_sync object_store, one replica and no rollout_placement.",
    )
    learner_placement: Literal["none", "pack", "strict_pack", "spread"] = Field(
        "none",
        description="Ray placement group of the learner ranks (one bundle per rank, reserved before any "
        "rank starts). `strict_pack`: all ranks on one node (fast collectives over NVLink); `pack`: as few nodes as "
        "fit; `spread`: across nodes; `none`: no group, each rank placed on its own.",
    )
    rollout_placement: Literal["none", "pack", "spread", "strict_spread"] = Field(
        "none",
        description="Ray placement group of the rollout replicas (one bundle per replica). `spread`: across "
        "nodes where possible; `strict_spread`: one replica per node or fail; a replica restarted after its node died "
        "goes where Ray reschedules its bundle.",
    )
    learner_custom_resources: CustomResources = Field(
        default_factory=dict,
        max_length=16,
        description="Ray custom resources each learner rank needs on top of "
        "its CPUs/GPUs, e.g. `{gpu_node: 1}` where GPU nodes start with `--resources '{\"gpu_node\": 8}'`; keeps "
        "ranks on the nodes that have them.",
    )
    rollout_custom_resources: CustomResources = Field(
        default_factory=dict,
        max_length=16,
        description="Ray custom resources each rollout replica needs (as learner_custom_resources).",
    )
    threads_per_actor: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="torch threads per learner rank / rollout replica. Default: in sync mode, where "
        "generation and learning take turns, each phase may use the job's whole CPU reservation (split over "
        "its actors); in one_step_off mode each actor uses its own CPUs. Capped by the CPUs the actor may run on "
        "(its affinity mask).",
    )

    @model_validator(mode="after")
    def _sharing_fits(self) -> ResourceSpec:
        # model.lora is checked where the whole job is seen (tgc_rl/rollout/engine.py: engine_kind)
        if self.rollout_sharing == "shared":
            refusals = {
                "rollout_engine 'hf'": self.rollout_engine == "hf",
                "weight_sync 'broadcast'": self.weight_sync == "broadcast",
                f"rollout_replicas {self.rollout_replicas}": self.rollout_replicas > 1,
                f"rollout_placement '{self.rollout_placement}'": self.rollout_placement != "none",
            }
            if bad := [k for k, v in refusals.items() if v]:
                raise ValueError(
                    f"resources.rollout_sharing 'shared' cannot work with {', '.join(bad)}: a shared engine is one "
                    "vLLM engine that receives adapters through the object store; use rollout_engine vllm (or "
                    "auto), weight_sync object_store, rollout_replicas 1 and rollout_placement none, or set "
                    "rollout_sharing 'own'"
                )
        return self

    def threads(self, role: Literal["learner", "rollout"], asynchronous: bool) -> int:
        """torch threads of one `role` actor (see `threads_per_actor`); the actor caps it by the CPUs it may run on."""
        if self.threads_per_actor:
            return self.threads_per_actor
        own = self.cpus_per_learner if role == "learner" else self.cpus_per_rollout
        if asynchronous:
            return max(1, int(own))
        job = self.learner_ranks * self.cpus_per_learner + self.rollout_replicas * self.cpus_per_rollout
        return max(1, int(job / (self.learner_ranks if role == "learner" else self.rollout_replicas)))


class CheckpointSpec(_Strict):
    every_steps: int = Field(
        10, ge=0, le=MAX_STEPS, description="Save every N steps (0: only at the end/on cancel)."
    )
    keep_last: int = Field(2, ge=1, le=10_000, description="Keep the newest N checkpoints.")
    save_optimizer: bool = Field(
        True,
        description="Save the AdamW moments (2x the weights in float32) for exact resume; without them "
        "a resumed run restarts AdamW from zero moments (weights, schedule, RNG and data position still resume).",
    )


class TracesSpec(_Strict):
    """Rollout traces: a bounded sample of each step's trajectories in `<run_dir>/traces/` (JSON Lines), read
    back through `GET /v1/jobs/{id}/samples` and `tgc samples`."""

    enabled: bool = Field(True, description="Keep a sample of each step's trajectories.")
    per_group: list[Literal["best", "worst", "random"]] = Field(
        ["best", "worst", "random"],
        max_length=3,
        description="From every group: its best and worst response by reward, and one other at random.",
    )
    full_groups: int = Field(
        1, ge=0, le=MAX_PROMPTS_PER_STEP, description="Every response of the step's first N groups."
    )
    everything: bool = Field(
        False, description="Every response of every step (still within the byte bounds)."
    )
    logprobs: bool = Field(False, description="Keep each response token's sampling log-prob.")
    max_text_chars: int = Field(
        4000,
        ge=64,
        le=1 << 20,
        description="Prompt and response text beyond this is cut (marked `truncated`).",
    )
    max_step_bytes: int = Field(
        256 << 10, ge=4096, le=16 << 20, description="At most this much JSON per step; the rest is dropped."
    )
    steps_per_file: int = Field(50, ge=1, le=MAX_STEPS, description="Steps per file (`steps-<first>.jsonl`).")
    max_total_bytes: int = Field(
        64 << 20,
        ge=64 << 10,
        le=1 << 30,
        description="The oldest files are removed beyond this many bytes in all.",
    )

    @model_validator(mode="after")
    def _one_file_fits(self) -> TracesSpec:
        # rotation removes whole files, never the one being written: it alone must fit the total
        if self.max_step_bytes * self.steps_per_file > self.max_total_bytes:
            raise ValueError(
                f"traces: steps_per_file x max_step_bytes ({self.steps_per_file} x {self.max_step_bytes}) exceeds "
                f"max_total_bytes ({self.max_total_bytes}); lower one of the first two or raise the third"
            )
        return self


class MlflowTrackerSpec(_Strict):
    """An MLflow run per trainer attempt. Where it logs (MLFLOW_TRACKING_URI) and any credentials come from the
    trainer's environment, which the operator sets; never from the spec."""

    kind: Literal["mlflow"] = "mlflow"
    experiment: str = Field(
        "tgc-rl",
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\- /]*$",
        description="The MLflow experiment the run goes in (created when missing).",
    )


class WandbTrackerSpec(_Strict):
    """A Weights & Biases run in the run directory, offline unless the operator's environment sets WANDB_MODE."""

    kind: Literal["wandb"] = "wandb"
    project: str = Field(
        "tgc-rl",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$",
        description="The project.",
    )
    samples_every: int = Field(
        10, ge=1, le=MAX_STEPS, description="A table of the step's traced samples every N steps."
    )


TrackerSpec = Annotated[MlflowTrackerSpec | WandbTrackerSpec, Field(discriminator="kind")]


# rollouts held ahead in k_step mode: each holds its groups in memory and moves the data position on
MAX_ASYNC_DEPTH = 8
# The behaviour correction of an async job whose objective.overrides name none: token-level truncated IS,
# min(w_t, C) with C = behaviour_cap (2), node-local so it keeps cancellation (docs/objectives.md#k-step-asynchrony).
ASYNC_CORRECTION = "token_tis"


def async_objective_overrides(name: str, overrides: dict[str, Any], depth: int) -> dict[str, Any]:
    """`overrides` as an objective with `depth` rollouts generated ahead runs them: ASYNC_CORRECTION added in
    async modes unless `behaviour_correction` is set (`none` turns it off) or the preset's ratio is GMPO's
    geo_mean (where no correction is defined); sync jobs (depth 0) unchanged."""
    if depth == 0 or "behaviour_correction" in overrides or resolve(name, overrides).ratio == "geo_mean":
        return dict(overrides)
    return {**overrides, "behaviour_correction": ASYNC_CORRECTION}


class AsyncSpec(_Strict):
    mode: Literal["sync", "one_step_off", "k_step"] = Field(
        "sync",
        description="`one_step_off`: generate step n+1 while the learner trains on step n; `k_step`: keep up to "
        "`max_staleness` (k) rollouts generated ahead of the learner (a k-deep queue; samples lag up to k versions). "
        "Both async modes correct for the lag by default: the objective gets `behaviour_correction: token_tis` "
        "(min(pi_old / pi_behaviour, behaviour_cap = 2) per token, which keeps cancellation) unless "
        "`objective.overrides` sets `behaviour_correction`; `behaviour_correction: none` turns it off.",
    )
    max_staleness: int = Field(1, ge=0, le=64, description="Max policy-version lag of a trained sample.")
    steps_per_call: int = Field(
        1,
        ge=1,
        le=MAX_ASYNC_DEPTH,
        description="k_step: the queued rollouts of this many steps are sampled in one engine call, by one "
        "weights version. A step's rollout lasts as long as its longest response, and near its end the engine "
        "decodes a few capped responses at a fraction of its full-batch rate; in one call the steps share that "
        "tail once (at 1024 tokens two steps in one call took 0.74x the time of two calls: benchmarks/RESULTS.md, "
        "long-tail generation). At most k: the last step of a call lags up to k versions, as in any k_step queue.",
    )

    @model_validator(mode="after")
    def _k_step_depth(self) -> AsyncSpec:
        if self.mode == "k_step" and not 2 <= self.max_staleness <= MAX_ASYNC_DEPTH:
            raise ValueError(
                f"async.max_staleness must be between 2 and {MAX_ASYNC_DEPTH} with async.mode 'k_step' (got "
                f"{self.max_staleness}): it is the queue depth k; for a lag of one use async.mode 'one_step_off'"
            )
        if self.steps_per_call > 1 and (self.mode != "k_step" or self.steps_per_call > self.max_staleness):
            raise ValueError(
                f"async.steps_per_call {self.steps_per_call} needs async.mode 'k_step' with async.max_staleness "
                f">= {self.steps_per_call} (got mode {self.mode!r}, max_staleness {self.max_staleness}): the last "
                "step sampled in a call is trained that many versions later; raise max_staleness or set "
                "steps_per_call 1"
            )
        return self

    @property
    def depth(self) -> int:
        """Rollouts generated ahead of the learner: 0 (sync), 1 (one_step_off) or k = max_staleness (k_step)."""
        return {"sync": 0, "one_step_off": 1}.get(self.mode, self.max_staleness)


class EvalSpec(_Strict):
    """Held-out evaluation: run through the job's rollout replicas (current weights) and reward pool."""

    dataset: DatasetParams | None = Field(
        None,
        description="The evaluation rows (the same fields as `task.params` of a `dataset` task; every row, in "
        "file order). Default: the training dataset's held-out rows (`task.params.holdout`).",
    )
    every_steps: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="Evaluate every N optimizer steps (0: only at the start and the end).",
    )
    at_start: bool = Field(True, description="Evaluate the initial weights too (step 0): the baseline.")
    samples_per_prompt: int = Field(
        1,
        ge=1,
        le=MAX_GROUP_SIZE,
        description="k: samples per prompt; reported as `eval/pass@k` and mean accuracy.",
    )
    greedy: bool = Field(
        True,
        description="Greedy decoding (then samples_per_prompt must be 1); else sampled at "
        "`temperature` / `top_p`.",
    )
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature when not greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus mass when not greedy.")
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        le=MAX_NEW_TOKENS,
        description="Response budget; default and maximum: sampling.max_new_tokens.",
    )
    max_prompts: int = Field(256, ge=1, le=100_000, description="Evaluate at most the first N rows.")
    also_greedy: bool = Field(
        False,
        description="With sampled evaluation (greedy: false), also answer each prompt once greedily, "
        "reported as `eval/greedy/...` beside the sampled metrics.",
    )

    @model_validator(mode="after")
    def _greedy_means_one_sample(self) -> EvalSpec:
        if self.greedy and self.samples_per_prompt > 1:
            raise ValueError("samples_per_prompt > 1 needs greedy: false (greedy samples are all the same)")
        if self.greedy and self.also_greedy:
            raise ValueError("also_greedy needs greedy: false (the evaluation is already greedy)")
        return self


IBPO_PRESET = "ibpo_cp"  # the objective that turns the `ibpo` section on by default
REVISION_SLOTS = ("prompt", "response", "references")  # the slots of ibpo.revision_template, each required
DEFAULT_REVISION_TEMPLATE = (
    "{prompt}\n\nHere is an attempt at this task:\n{response}\n\nHere is a correct solution:\n{references}\n\n"
    "Rewrite the attempt: keep what is right, fix what is wrong, and answer in the same format."
)


class IbpoSpec(_Strict):
    """IBPO compare-and-correct credit (arXiv 2605.16302; docs/ibpo.md): each incorrect response of a group with
    a correct sibling is revised by the current policy, shown a correct sibling; a revision that the verifier
    accepts earns the response phi = rho before group centring (R' = R + lambda * phi)."""

    enabled: bool = Field(True, description="Generate and score revisions every step.")
    rho: float = Field(
        0.5, ge=0, le=10, description="phi of a repaired incorrect response (the paper's 0.5)."
    )
    lambda_: float | None = Field(
        None,
        ge=0,
        le=100,
        description="Weight of phi in R' = R + lambda * phi. Default: the objective's "
        "`bonus_coef` (0.6, the paper's, in `ibpo_cp`; 1.0 in the other presets).",
    )
    references: int = Field(
        1,
        ge=1,
        le=MAX_GROUP_SIZE - 1,
        description="Correct siblings shown in a revision "
        "prompt (at most; K-1 in the paper). Only correct siblings are used as references.",
    )
    mask: Literal["none", "naive", "symmetric"] = Field(
        "none",
        description="Edit-mask variant: credit only the tokens of a repaired response that the revision "
        "changed (token-level Levenshtein alignment). `naive`: as reported; response-coupled, it breaks "
        "cancellation on prefixes shared with a correct sibling (kept for comparison); `symmetric`: one decision "
        "per shared prefix-tree node (kept if any copy keeps it), cancellation-preserving; `none`: no mask.",
    )
    revision_template: str = Field(
        DEFAULT_REVISION_TEMPLATE,
        min_length=1,
        max_length=16_384,
        description="The revision prompt's user turn (through the chat template like a task prompt), with the "
        "slots {prompt} (the task prompt), {response} (the incorrect response) and {references} (the correct "
        "siblings, separated by a line `---`), each filled literally; no other braces.",
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        le=MAX_NEW_TOKENS,
        description="Revision length budget; default "
        "and maximum: sampling.max_new_tokens. Revisions use the step's temperature "
        "and top_p; a revision prompt over sampling.max_prompt_tokens is skipped.",
    )

    @field_validator("revision_template")
    @classmethod
    def _template_fields(cls, v: str) -> str:
        # filled by fill_template, like the task templates: never str.format (docs/security.md)
        return check_template(v, REVISION_SLOTS, required=REVISION_SLOTS)
