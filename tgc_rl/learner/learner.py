"""The learner: one FSDP2 rank that turns rollout batches into optimizer steps with an rlcore objective.

A plain class (no Ray): `LearnerGroup` places one per Ray actor; tests drive it directly. It reads its slice
of the job spec (`LearnerSpec`) only, and leaves torch's thread count to its host (the rank actor). Every rank gets
the whole step batch and derives the same plan from it (tgc_rl/learner/plan.py): whole groups per
optimizer step and per micro-batch, step-constant normalisers (rlcore.StepNorm of the whole optimizer
step), gradients summed over micro-batches and ranks. The sum is then exactly the single-process
full-batch gradient, so cancellation inside a group survives any split (docs/objectives.md#step-constant-normalisers).

One training pass over a micro-batch:
    lp, ent = policy(...)                       # (b, T) chunked log-probs, with grad
    leaf = lp.detach().requires_grad_()         # docs/objectives.md#per-token-weights: w on a detached leaf
    out = objective.loss(leaf, old, ...)
    g = autograd.grad(out.loss, leaf)           # -w of the training loss (one small autograd call)
    lp.backward(g)                              # the model backward, exactly as out.loss.backward()
so the diagnostics' ascent weights cost no extra model pass.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor

import rlcore
from tgc_rl.batch import SampledBatch, TrainBatch
from tgc_rl.learner import checkpoint, lora, sharding
from tgc_rl.learner.logprobs import PolicyLogprobs
from tgc_rl.learner.plan import MicroBatchLimit, MiniBatch, group_spans, plan_minibatches, trim_padding
from tgc_rl.learner.schedule import lr_factor
from tgc_rl.learner.spec import LearnerSpec
from tgc_rl.learner.step_metrics import StepMetrics
from tgc_rl.startup import transformers_without_sklearn

if TYPE_CHECKING:
    from peft import PeftModel

    from rlcore.shared_nodes import SharedPrefixes


@dataclass(frozen=True)
class DiagnosticInputs:
    """What the cancellation diagnostics read of one micro-batch, on the host (the micro-batch's own tensors
    already are): the ascent weights, old log-probs, entropies and clip mask, detached."""

    micro: TrainBatch
    w: Tensor
    old: Tensor
    ent: Tensor
    clipped: Tensor | None

    @classmethod
    def to_host(
        cls, w: Tensor, micro: TrainBatch, old: Tensor, ent: Tensor, clipped: Tensor | None
    ) -> DiagnosticInputs:
        def host(x: Tensor) -> Tensor:
            return x.detach().cpu()  # a CPU tensor's .cpu() is itself: no copy on a CPU

        return cls(micro, host(w), host(old), host(ent), None if clipped is None else host(clipped))


class Learner:
    def __init__(
        self,
        spec: LearnerSpec,
        model_path: Path,
        rank: int = 0,
        world_size: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int | None = None,
    ):
        transformers_without_sklearn()  # before the policy's transformers import
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"rank {rank} / world_size {world_size}: need world_size >= 1 and 0 <= rank < world_size"
            )
        self.spec = spec
        self.model_path = Path(model_path)
        if not (self.model_path / "config.json").exists():
            raise FileNotFoundError(
                f"model_path {self.model_path} has no config.json; pass "
                "tgc_rl.models.model_dir(job.model, job.seed)"
            )
        self.rank, self.world_size = rank, world_size
        self.device = sharding.learner_device(spec.gpus)
        self.mesh = sharding.init_process_group(rank, world_size, self.device, master_addr, master_port)
        # `auto` resolved here, on the host this rank runs on (the spec keeps `auto`). tgc_rl.config (pydantic)
        # is imported only then: a rank given an explicit dtype runs where only torch is (scripts/gpu-check.sh).
        self.model_dtype = spec.model_dtype
        if self.model_dtype == "auto":
            from tgc_rl.config import resolve_dtype

            self.model_dtype = resolve_dtype(spec.model_dtype, on_gpu=self.device.type == "cuda")
        self.compute_dtype = sharding.compute_dtype(self.model_dtype, self.device)
        self.objective = rlcore.Objective(spec.objective, spec.objective_config)
        self.peft: PeftModel | None = None  # PEFT's wrapper of the policy's model (model.lora)
        self.policy = self._build_policy(trainable=True)
        self.micro_limit = MicroBatchLimit(
            spec.optim.micro_batch_size, spec.optim.micro_batch_tokens, tree=self.policy.prefix_tree
        )
        # The frozen reference is only loaded when the loss uses it (a KL term); with LoRA it is the policy
        # with its adapters off (lora.adapters_disabled), no second copy.
        self.uses_reference = self.objective.needs_reference
        self.reference = (
            self._build_policy(trainable=False) if self.uses_reference and spec.lora is None else None
        )
        o = spec.optim
        params = self.policy.parameters() if spec.lora is None else lora.trainable_parameters(self.policy)
        self.optimizer = torch.optim.AdamW(
            params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, fused=True
        )
        self.stages_per_batch = self.objective.stage_count
        self.total_optimizer_steps = spec.steps * o.ppo_epochs * o.mini_batches * self.stages_per_batch
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, o, self.total_optimizer_steps)
        )
        self.train_steps = 0  # train_step calls (rollout batches consumed)
        self.optimizer_steps = 0
        self.last_lr = self.optimizer.param_groups[0]["lr"]  # lr of the latest optimizer step

    # -- model ----------------------------------------------------------------------------------------
    def _build_policy(self, trainable: bool) -> PolicyLogprobs:
        from transformers import AutoModelForCausalLM

        # float32 master weights whatever the checkpoint's dtype; FSDP2 casts to the compute dtype.
        lm = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        lm.config.use_cache = False
        if trainable and self.spec.lora is not None:  # adapters in `lm` itself; the rest frozen
            self.peft = lora.wrap(lm, self.spec.lora)
        if trainable and self.spec.optim.activation_checkpointing:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if not trainable:
            lm.requires_grad_(False)
        layers = getattr(lm.get_decoder(), "layers", None)
        if layers is None:
            raise ValueError(
                f"{self.model_path}: expected a decoder with `.layers` (Llama/Qwen/Mistral-style "
                "causal LM) to shard per layer"
            )
        policy = PolicyLogprobs(
            lm,
            self.spec.optim.logprob_chunk_tokens,
            self.spec.temperature,
            prefix_tree=self.spec.optim.shared_prompt_forward,
            dense_tree_max_tokens=self.spec.optim.dense_tree_max_tokens,
        )
        sharding.shard(policy, list(layers), self.mesh, self.compute_dtype)
        policy.train(trainable)
        return policy

    # -- public API -----------------------------------------------------------------------------------
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """All optimizer steps of one rollout batch (ppo_epochs x mini_batches x objective stages).
        Collective: every rank gets the same whole batch. Returns the step's metrics (same on all ranks)."""
        t_start = time.perf_counter()
        o = self.spec.optim
        groups = group_spans(batch)
        metrics = StepMetrics()
        # Old log-probs: for a single on-policy update the training forward's own (detached) log-probs are
        # exactly pi_old, so no extra pass; otherwise one no-grad pass before the first update.
        needs_old = o.ppo_epochs > 1 or o.mini_batches > 1 or self.stages_per_batch > 1
        old = ref = None
        if needs_old:
            t0 = time.perf_counter()
            old = self._batch_logprobs(batch, self.policy)
            metrics.add_time("timing/old_logprobs_s", time.perf_counter() - t0)
        if self.uses_reference:
            t0 = time.perf_counter()
            ref = self._reference_logprobs(batch)
            metrics.add_time("timing/ref_logprobs_s", time.perf_counter() - t0)
        staged = self.stages_per_batch > 1  # then needs_old, so `old` is set
        stage_masks = (
            self.objective.stages(old, batch.response_mask) if staged and old is not None else [None]
        )
        first = True
        for stage, stage_mask in enumerate(stage_masks):
            for epoch in range(o.ppo_epochs):
                order = self._group_order(len(groups), epoch + stage * o.ppo_epochs)
                for mb in plan_minibatches(groups, o.mini_batches, self.world_size, self.micro_limit, order):
                    self._optimizer_step(batch, mb, old, ref, stage_mask, metrics, first_pass=first)
                first = False
        self.train_steps += 1
        metrics.add_time("timing/learner_step_s", time.perf_counter() - t_start)
        out = metrics.reduce(self.device)
        n_updates = len(stage_masks) * o.ppo_epochs * o.mini_batches
        out["loss"] = out.pop("loss_sum") / n_updates
        out["grad_norm"] = out.pop("grad_norm_sum") / n_updates
        out["lr"] = self.last_lr
        out["optimizer_steps"] = float(self.optimizer_steps)
        out["tokens"] = float(batch.response_mask.sum())
        out["sequences"] = float(len(batch))
        out["groups"] = float(len(groups))
        passes = len(stage_masks) * o.ppo_epochs
        out["tokens_per_s"] = float(batch.attention_mask.sum()) * passes / out["timing/learner_step_s"]
        return out

    @torch.no_grad()
    def logprobs(self, batch: SampledBatch) -> Tensor:
        """(B, T) log-probs of the response tokens under the current weights (0 off the mask). Collective."""
        return self._batch_logprobs(batch, self.policy)

    def gradients(self, batch: TrainBatch) -> dict[str, Tensor]:
        """The full-batch gradient of the objective at the current weights (HF names, full tensors, CPU),
        without an update: one on-policy pass, same plan as train_step's first update. Collective."""
        groups = group_spans(batch)
        mb = plan_minibatches(groups, 1, self.world_size, self.micro_limit)[0]
        self.optimizer.zero_grad(set_to_none=True)
        self._accumulate(batch, mb, None, None, None, StepMetrics(), first_pass=True)
        grads = {}
        for name, p in self.policy.lm.named_parameters():
            if p.grad is not None:
                grads[name] = sharding.full_tensor(p.grad).detach().cpu().clone()
        self.optimizer.zero_grad(set_to_none=True)
        return grads

    def full_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """Full weights with HF names on CPU, in `dtype` (default: the job's model dtype), tied duplicates
        left out as save_pretrained does (with LoRA: the adapters merged in, the base model's names).
        Collective; rank 0 gets the dict, other ranks an empty one."""
        dtype = dtype or getattr(torch, self.model_dtype)
        if self.spec.lora is not None:
            fp32 = lora.merged(self._gathered(lambda name: True), self.spec.lora.rank, self.spec.lora.alpha)
            return {k: v.to(dtype if v.is_floating_point() else v.dtype) for k, v in fp32.items()}
        out, tied = {}, self._tied_names()
        for name, t in self.policy.lm.state_dict().items():
            if name in tied:
                continue
            full = sharding.full_tensor(t)
            if self.rank == 0:
                # one copy: a cast already makes a new tensor (a following clone would copy it again)
                out[name] = full.detach().to(
                    "cpu", dtype=dtype if full.is_floating_point() else full.dtype, copy=True
                )
        return out

    def adapter_state_dict(self) -> dict[str, Tensor]:
        """The LoRA adapter alone: PEFT names, the job's model dtype, CPU (what the engine loads and a
        checkpoint's adapter/ holds). Collective; rank 0 gets the dict, other ranks an empty one."""
        from tgc_rl.weight_sync.adapter import peft_name

        if self.spec.lora is None:
            raise RuntimeError("adapter_state_dict: this learner trains full weights (model.lora is not set)")
        dtype = getattr(torch, self.model_dtype)
        return {peft_name(k, lora.ADAPTER): v.to(dtype) for k, v in self._gathered(lora.is_adapter).items()}

    @torch.no_grad()
    def canary_logprobs(self, sequence: list[int], prompt_len: int) -> list[float]:
        """log p of sequence[prompt_len:] at temperature 1 under the current weights: what an engine's
        `score` must reproduce after a sync (the canary). Collective: every rank runs the same forward."""
        policy = self.policy
        was_training, inv_temperature = policy.training, policy.inv_temperature
        policy.eval()
        policy.inv_temperature = 1.0
        try:
            ids = torch.tensor([sequence], device=self.device)
            response = torch.ones((1, len(sequence) - prompt_len), dtype=torch.long, device=self.device)
            lp, _ = policy(ids, torch.ones_like(ids), prompt_len, response)
        finally:
            policy.inv_temperature = inv_temperature
            policy.train(was_training)
        if self.world_size == 1:  # forward kept the gathered weights (sharding.shard): free them
            sharding.reshard(policy)
        return lp[0].float().cpu().tolist()

    def save(self, path: Path) -> None:
        """path/model: HF directory (+ tokenizer; with LoRA only on model.lora.save_merged: the merged weights);
        path/adapter: the LoRA adapter (PEFT format); path/learner: exact training state. Collective."""
        path = Path(path)
        if self.spec.lora is not None:
            adapter = self.adapter_state_dict()
            if self.rank == 0:
                from tgc_rl.weight_sync.adapter import write_peft_dir

                lo = self.spec.lora
                write_peft_dir(path / "adapter", adapter, lo.rank, lo.alpha, str(self.model_path), lo.dropout)
        if self.spec.lora is None or self.spec.lora.save_merged:
            state = self.full_state_dict()
            if self.rank == 0:
                tokenizer = Path(self.spec.tokenizer).expanduser() if self.spec.tokenizer else self.model_path
                checkpoint.save_hf_model(
                    state, self.model_path, tokenizer, path / "model", getattr(torch, self.model_dtype)
                )
            del state
        checkpoint.save_training_state(
            path / "learner",
            self.policy,
            self.optimizer,
            {
                "scheduler": self.scheduler.state_dict(),
                "train_steps": self.train_steps,
                "optimizer_steps": self.optimizer_steps,
                "world_size": self.world_size,
            },
            with_optimizer=self.spec.save_optimizer,
            trainable_only=self.spec.lora is not None,  # the frozen base is the model directory's
        )

    def load(self, path: Path) -> None:
        """Restore what save(path) wrote; continues exactly where that learner was. Collective."""
        extra = checkpoint.load_training_state(
            Path(path) / "learner", self.policy, self.optimizer, trainable_only=self.spec.lora is not None
        )
        self.scheduler.load_state_dict(extra["scheduler"])
        self.train_steps = extra["train_steps"]
        self.optimizer_steps = extra["optimizer_steps"]

    def close(self) -> None:
        """Leave the process group (the process can then host another learner)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    # -- internals ------------------------------------------------------------------------------------
    def _gathered(self, keep: Callable[[str], bool]) -> dict[str, Tensor]:
        """Full float32 CPU copies of the kept entries of the model's state dict, tied duplicates left out.
        Collective; rank 0 gets the dict, other ranks an empty one."""
        out, tied = {}, self._tied_names()
        for name, t in self.policy.lm.state_dict().items():
            if name in tied or not keep(name):
                continue
            full = sharding.full_tensor(t)
            if self.rank == 0:
                out[name] = full.detach().to("cpu", copy=True)
        return out

    def _reference_logprobs(self, batch: SampledBatch) -> Tensor:
        if self.reference is not None:
            return self._batch_logprobs(batch, self.reference)
        assert self.peft is not None  # uses_reference without a reference copy: a LoRA policy
        with lora.adapters_disabled(self.peft):  # the base model is the LoRA policy's reference
            return self._batch_logprobs(batch, self.policy)

    def _tied_names(self) -> set[str]:
        seen, tied = set(), set()
        for name, p in self.policy.lm.named_parameters(remove_duplicate=False):
            if id(p) in seen:
                tied.add(name)
            seen.add(id(p))
        return tied

    def _group_order(self, n_groups: int, pass_index: int) -> list[int] | None:
        """Group order of one pass: as given for the first, then a reshuffle per pass (same on every rank,
        reproducible from the seed and the step) so mini-batches mix across epochs."""
        if pass_index == 0 or self.spec.optim.mini_batches == 1:
            return None
        gen = torch.Generator().manual_seed(
            self.spec.seed * 1_000_003 + self.train_steps * 1_009 + pass_index
        )
        return torch.randperm(n_groups, generator=gen).tolist()

    def _forward(self, policy: PolicyLogprobs, micro: SampledBatch) -> tuple[Tensor, Tensor]:
        dev = self.device
        return policy(
            micro.input_ids.to(dev),
            micro.attention_mask.to(dev),
            micro.prompt_len,
            micro.response_mask.to(dev),
        )

    @torch.no_grad()
    def _batch_logprobs(self, batch: SampledBatch, policy: PolicyLogprobs) -> Tensor:
        """(B, T) log-probs of the whole batch: each rank computes its share, then one all-reduce."""
        was_training = policy.training
        policy.eval()
        out = torch.zeros(batch.response_mask.shape, dtype=torch.float32, device=self.device)
        mb = plan_minibatches(group_spans(batch), 1, self.world_size, self.micro_limit)[0]
        for rows in mb.for_rank(self.rank):
            micro = trim_padding(batch.select(mb.rows[:1] if rows is None else rows))
            lp, _ = self._forward(policy, micro)
            if rows is not None:
                out[rows.to(self.device), : lp.shape[1]] = lp
        policy.train(was_training)
        if self.world_size == 1:  # forward kept the gathered weights (sharding.shard): free them
            sharding.reshard(policy)
        else:
            dist.all_reduce(out)
        return out.cpu()

    def _optimizer_step(
        self,
        batch: TrainBatch,
        mb: MiniBatch,
        old: Tensor | None,
        ref: Tensor | None,
        stage_mask: Tensor | None,
        metrics: StepMetrics,
        first_pass: bool,
    ) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = self._accumulate(batch, mb, old, ref, stage_mask, metrics, first_pass)
        metrics.add_time("timing/fwd_bwd_s", time.perf_counter() - t0)
        t0 = time.perf_counter()
        grad_norm = self._clip_grad_norm(self.spec.optim.grad_clip)
        self.last_lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer_steps += 1
        metrics.add_time("timing/optim_s", time.perf_counter() - t0)
        metrics.add_sum("loss_sum", loss)
        if self.rank == 0:  # identical on all ranks: count it once in the sum
            metrics.add_sum("grad_norm_sum", grad_norm)
            metrics.add_sum("grad_clipped_steps", float(grad_norm > self.spec.optim.grad_clip))

    def _accumulate(
        self,
        batch: TrainBatch,
        mb: MiniBatch,
        old: Tensor | None,
        ref: Tensor | None,
        stage_mask: Tensor | None,
        metrics: StepMetrics,
        first_pass: bool,
    ) -> float:
        """Forward/backward of this rank's micro-batches of one optimizer step; grads accumulate in place.
        Returns this rank's share of the step loss."""
        step_mask = batch.response_mask[mb.rows]
        sizes = {g.stop - g.start for g in group_spans(batch.select(mb.rows))}
        norm = rlcore.StepNorm(
            tokens=max(float(step_mask.sum()), 1.0),
            sequences=len(mb.rows),
            length=max(batch.response_mask.shape[1], self.spec.max_new_tokens),
            group_size=sizes.pop() if len(sizes) == 1 else None,
        )
        self.policy.train()
        total = 0.0
        passes = mb.for_rank(self.rank)
        for i, rows in enumerate(passes):
            if self.world_size == 1:  # nothing to reduce across ranks: sum the micro-batches, reduce once
                sharding.sync_after_backward(self.policy, sync=i == len(passes) - 1)
            if rows is None:  # padding pass: same collectives as the other ranks, zero gradient
                lp, _ = self._forward(self.policy, trim_padding(batch.select(mb.rows[:1])))
                lp.backward(torch.zeros_like(lp))
                continue
            total += self._micro_step(batch, rows, norm, old, ref, stage_mask, metrics, first_pass)
        return total

    def _micro_step(
        self,
        batch: TrainBatch,
        rows: Tensor,
        norm: rlcore.StepNorm,
        old: Tensor | None,
        ref: Tensor | None,
        stage_mask: Tensor | None,
        metrics: StepMetrics,
        first_pass: bool,
    ) -> float:
        micro = trim_padding(batch.select(rows))
        T = micro.response_mask.shape[1]
        mask = micro.response_mask.to(self.device)
        lp, ent = self._forward(self.policy, micro)
        old_mb = lp.detach() if old is None else old[rows, :T].to(self.device)
        ref_mb = None if ref is None else ref[rows, :T].to(self.device)
        stage_mb = None if stage_mask is None else stage_mask[rows, :T].to(self.device)
        n_tok = float(mask.sum())
        behaviour = micro.rollout_logprobs.to(self.device)
        # One scan of the token history for the mismatch and the diagnostics: nodes are shared on the whole
        # history (multi-turn observations included), measured on model tokens (rlcore.shared_nodes).
        from rlcore.shared_nodes import (
            SharedPrefixes,  # numba: here, not at import (the GPU check's torch-only run)
        )

        prefixes = SharedPrefixes.of(micro.response_ids, micro.history_mask, micro.group_ids)
        if first_pass:  # numerics of the rollout engine vs this learner, before any update of this batch
            self._mismatch(old_mb, behaviour, micro, mask, prefixes, metrics)
        metrics.add_mean("entropy", float((ent.detach() * mask).sum()) / max(n_tok, 1.0), n_tok)
        active = mask if stage_mb is None else stage_mb
        if not bool(active.any()):  # nothing to learn from here: zero-gradient pass, collectives stay aligned
            lp.backward(torch.zeros_like(lp))
            return 0.0
        uses_entropy = self.objective.needs_entropies
        lp_leaf = lp.detach().requires_grad_(True)
        ent_leaf = ent.detach().requires_grad_(True) if uses_entropy else None
        out = self.objective.loss(
            lp_leaf,
            old_mb,
            micro.loss_advantages.to(self.device),
            mask,
            micro.group_ids.to(self.device),
            ref_mb,
            step=norm,
            stage_mask=stage_mb,
            entropies=ent_leaf,
            behaviour_logprobs=behaviour,  # read only when the objective has a behaviour_correction
        )
        leaves = [lp_leaf] if ent_leaf is None else [lp_leaf, ent_leaf]
        regularised = out.loss is not out.pg_loss  # KL or entropy terms besides the policy gradient
        grads = torch.autograd.grad(out.loss, leaves, retain_graph=regularised)
        # Diagnostics read the policy-gradient weights alone: KL/entropy terms are not meant to cancel.
        w_pg = -torch.autograd.grad(out.pg_loss, lp_leaf)[0] if regularised else -grads[0]
        # The host reads all it needs of this micro-batch before the model's backward is queued. A read waits
        # for every kernel queued before it: after the backward it would wait for the whole backward, and the
        # device would then idle through the diagnostics. Read first, and the diagnostics (on the host) and the
        # next micro-batch's launches overlap the device's backward. On a CPU the order changes nothing.
        loss = float(out.loss.detach())
        metrics.add_means({k: v for k, v in out.metrics.items() if k != "tokens"}, n_tok, prefix="objective/")
        diag_inputs = DiagnosticInputs.to_host(w_pg, micro, old_mb, ent, out.clipped)
        torch.autograd.backward([lp, ent][: len(grads)], list(grads))
        t0 = time.perf_counter()
        self._diagnostics(diag_inputs, prefixes, metrics)
        metrics.add_time("timing/diagnostics_s", time.perf_counter() - t0)  # vs timing/learner_step_s
        return loss

    def _mismatch(
        self,
        old: Tensor,
        behaviour: Tensor,
        micro: TrainBatch,
        mask: Tensor,
        prefixes: SharedPrefixes,
        metrics: StepMetrics,
    ) -> None:
        """rlcore's learner-vs-engine mismatch of one micro-batch (whole groups): k3 KL and the spread of the
        engine's log-probs across copies of shared tokens, the token-level corrections' cancellation condition."""
        m = rlcore.offpolicy.behaviour_mismatch(
            old, behaviour, mask, micro.response_ids, micro.group_ids, prefixes=prefixes
        )
        weights = m.weights()
        for key, value in m.metrics().items():
            if key in weights:
                metrics.add_mean(key, value, weights[key])
            elif key.endswith("_max"):
                if m.shared_pairs > 0:
                    metrics.add_peak(key, value)
            else:  # a count
                metrics.add_sum(key, value)

    def _diagnostics(self, x: DiagnosticInputs, prefixes: SharedPrefixes, metrics: StepMetrics) -> None:
        """rlcore's cancellation diagnostics (D1-D4/D7/D9/D10/D11) of one micro-batch, whose groups are
        whole, pooled over the step and the ranks by rlcore's rules (`rlcore.pooling_terms`). They read the
        unmasked advantages: w carries any credit mask, so D2 sees the imbalance a mask leaves in a shared node."""
        diag = rlcore.cancellation_diagnostics(
            x.w,
            x.micro.response_ids,
            x.micro.response_mask,
            x.micro.group_ids,
            x.micro.advantages,
            old_logprobs=x.old,
            entropies=x.ent,
            clipped=x.clipped,
            group_size=self.spec.group_size,
            prefixes=prefixes,
        )
        for t in rlcore.pooling_terms(diag, groups=float(len(torch.unique(x.micro.group_ids)))):
            if t.rule == "sum":
                metrics.add_sum(t.key, t.value)
            elif t.rule == "max":
                if t.weight > 0:  # a maximum the micro-batch does not define (e.g. D1 with no measured group)
                    metrics.add_peak(t.key, t.value)
            else:
                metrics.add_mean(t.key, t.value, t.weight)

    def _clip_grad_norm(self, max_norm: float) -> float:
        """Global L2 norm over all shards (one all-reduce), then scale every shard by the same factor."""
        grads = [sharding.local_tensor(p.grad) for p in self.policy.parameters() if p.grad is not None]
        sq = torch.stack(torch._foreach_norm(grads)).float().pow(2).sum()
        if self.world_size > 1:
            dist.all_reduce(sq)
        norm = float(sq.sqrt())
        if not math.isfinite(norm):
            raise FloatingPointError(
                f"non-finite gradient norm ({norm}) at optimizer step {self.optimizer_steps}; "
                "lower optim.lr or check the batch's advantages"
            )
        scale = min(1.0, max_norm / (norm + 1e-6))
        if scale < 1.0:
            torch._foreach_mul_(grads, scale)
        return norm
