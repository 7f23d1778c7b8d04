"""Learner checkpoints: an HF model directory for serving plus the exact training state for resume.

    path/model/    save_pretrained directory + tokenizer, in the job's dtype: loads in transformers and vLLM
    path/learner/  torch.distributed.checkpoint of the float32 master weights and AdamW state (sharded, one
                   file per rank; AdamW left out with checkpoint.save_optimizer=false), `state.pt` (schedule,
                   counters) and `rng-rank{r}.pt` (per-rank RNG)

Resume reads only path/learner: the HF directory may be bf16, the master weights are not.
"""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

log = logging.getLogger(__name__)

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


def save_hf_model(
    state_dict: dict[str, torch.Tensor], model_path: Path, tokenizer_path: Path, out: Path, dtype: torch.dtype
) -> None:
    """Write `state_dict` (full, HF names) as a save_pretrained directory with the tokenizer (rank 0 only)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):  # the skeleton only supplies config, class and tied-weight rules
        skeleton = AutoModelForCausalLM.from_config(config, dtype=dtype)
    out.mkdir(parents=True, exist_ok=True)
    skeleton.save_pretrained(out, state_dict=dict(state_dict), is_main_process=True)
    copied = False
    for name in _TOKENIZER_FILES:
        if (tokenizer_path / name).exists():
            shutil.copy2(tokenizer_path / name, out / name)
            copied = True
    if not copied:
        raise FileNotFoundError(
            f"no tokenizer files in {tokenizer_path}; set model.tokenizer to a tokenizer directory"
        )


def save_training_state(
    out: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    with_optimizer: bool = True,
    trainable_only: bool = False,
) -> None:
    """Collective: every rank writes its shards; rank 0 writes `extra` (schedule and counters).
    `with_optimizer=False` leaves out the AdamW moments (2x the weights in float32); `trainable_only` the
    frozen parameters (a LoRA job's base, which its model directory already holds)."""
    out.mkdir(parents=True, exist_ok=True)
    model_sd, optim_sd = _state_dicts(model, optimizer, trainable_only)
    dcp.save(
        {"model": model_sd, "optim": optim_sd} if with_optimizer else {"model": model_sd},
        checkpoint_id=str(out),
    )
    rank = dist.get_rank()
    torch.save(rng_state(), out / f"rng-rank{rank}.pt")
    if rank == 0:
        torch.save({**extra, "optimizer_saved": with_optimizer}, out / "state.pt")
    dist.barrier()


def _options(trainable_only: bool) -> StateDictOptions | None:
    return StateDictOptions(ignore_frozen_params=True, strict=False) if trainable_only else None


def _state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainable_only: bool) -> tuple:
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(trainable_only))
    if trainable_only:  # ignore_frozen_params keeps a tied duplicate's second name (lm_head of a tied model)
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        model_sd = {k: v for k, v in model_sd.items() if k in trainable}
    return model_sd, optim_sd


def load_training_state(
    src: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainable_only: bool = False
) -> dict[str, Any]:
    """Collective: restore weights, optimizer (where it was saved) and this rank's RNG; returns rank 0's
    `extra`."""
    if not (src / "state.pt").exists():
        raise FileNotFoundError(
            f"{src} is not a learner checkpoint (no state.pt); pass the directory given "
            "to save(), whose 'learner' subdirectory holds the training state"
        )
    rank = dist.get_rank()
    rng_file = src / f"rng-rank{rank}.pt"
    if not rng_file.exists():
        raise FileNotFoundError(
            f"{rng_file} is missing: the checkpoint was saved with fewer learner ranks; "
            "resume with the same resources.learner_ranks"
        )
    extra = torch.load(src / "state.pt", weights_only=False)
    options = _options(trainable_only)
    model_sd, optim_sd = _state_dicts(model, optimizer, trainable_only)
    with_optimizer = extra.get("optimizer_saved", True)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd} if with_optimizer else {"model": model_sd}
    dcp.load(state, checkpoint_id=str(src))
    if with_optimizer:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=options,
        )
    else:
        log.warning(
            "%s holds no optimizer state (checkpoint.save_optimizer was off): AdamW restarts from "
            "zero moments, so the resumed run is not identical to an uninterrupted one",
            src,
        )
        set_model_state_dict(model, state["model"], options=options)
        optimizer.state.clear()  # get_state_dict() above initialised it with a zero-gradient step
    set_rng_state(torch.load(rng_file, weights_only=False))
    return extra


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
