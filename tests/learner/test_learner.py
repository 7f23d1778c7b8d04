"""One FSDP2 rank (gloo, world size 1) on the tiny random Llama: log-probs, updates, checkpoints, options."""

import pytest
import torch

import rlcore
from tests.learner.test_prefix_tree import multi_turn
from tgc_rl.learner import Learner
from tgc_rl.learner.logprobs import PolicyLogprobs
from tgc_rl.learner.plan import group_spans, plan_minibatches
from tgc_rl.learner.sharding import bf16_supported

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CI machine has 2 cores shared by everything
    yield
    torch.set_num_threads(threads)


def _unsharded_logprobs(model_dir, batch, chunk=1_000_000):
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        lp, _ = PolicyLogprobs(lm, chunk).eval()(
            batch.input_ids, batch.attention_mask, batch.prompt_len, batch.response_mask
        )
    return lp


def test_logprobs_equal_whole_logits_of_the_unsharded_model(learner_spec, tiny_model_path, make_batch):
    batch = make_batch(n_groups=3)
    learner = Learner(
        learner_spec(**{"optim.logprob_chunk_tokens": 16, "optim.micro_batch_size": 4}), tiny_model_path
    )
    torch.testing.assert_close(
        learner.logprobs(batch), _unsharded_logprobs(tiny_model_path, batch), rtol=1e-5, atol=1e-5
    )


def test_train_steps_lower_the_loss_on_a_fixed_batch(learner_spec, tiny_model_path, make_batch):
    batch = make_batch()
    learner = Learner(learner_spec(), tiny_model_path)
    losses = [learner.train_step(batch)["loss"] for _ in range(4)]
    assert losses[-1] < losses[0] - 0.05, losses


def test_update_moves_logprobs_in_the_direction_of_the_advantage(learner_spec, tiny_model_path, make_batch):
    batch = make_batch(n_groups=4, seed=3)
    learner = Learner(learner_spec(**{"optim.lr": 3e-4}), tiny_model_path)
    before = learner.logprobs(batch)
    learner.train_step(batch)
    delta = ((learner.logprobs(batch) - before) * batch.response_mask).sum(1)
    adv = batch.advantages
    assert float((adv * delta).sum()) > 0
    assert delta[adv > 0].mean() > 0 > delta[adv < 0].mean()


def test_step_reports_its_metrics(learner_spec, tiny_model_path, make_batch):
    batch = make_batch()
    m = Learner(learner_spec(), tiny_model_path).train_step(batch)
    for key in (
        "loss",
        "grad_norm",
        "lr",
        "entropy",
        "tokens",
        "tokens_per_s",
        "timing/fwd_bwd_s",
        "timing/optim_s",
        "mismatch/logprob_abs_diff",
        "mismatch/k3_kl",
        "mismatch/shared_spread_mean",
        "mismatch/shared_spread_max",
        "mismatch/shared_pairs",
        "objective/clip/frac",
        "diag/d1_gcpr",
        "diag/d2_residual",
        "diag/d2_nodes",
        "diag/d3_kappa_cv",
        "diag/d4_groups_complete_frac",
        "diag/d7_entropy_common",
        "diag/d7_entropy_shared",
        "diag/d7_entropy_fork",
        "diag/d9_absw_share_p00_10",
        "diag/d10_clipfrac_pos",
        "diag/d11_corr_len_adv",
    ):
        assert key in m, key
    assert m["tokens"] == float(batch.response_mask.sum())
    assert 0 < m["timing/diagnostics_s"] < m["timing/learner_step_s"]  # their cost, reported every step
    assert m["diag/d4_groups_complete_frac"] == 1.0
    assert m["diag/d1_gcpr"] < 1e-5  # cp_grpo cancels on the groups' shared first tokens
    assert m["diag/d2_nodes"] > 0 and m["diag/d2_residual"] < 1e-5  # and on every shared node
    # The synthetic rollout log-probs are not the model's: the mismatch metric must see it.
    assert m["mismatch/logprob_abs_diff"] > 1.0


@pytest.mark.parametrize("mask", ["naive", "symmetric"])
def test_d2_sees_the_imbalance_a_credit_mask_leaves_in_shared_nodes(
    learner_spec, tiny_model_path, make_batch, mask
):
    """IBPO's edit mask zeroes the unchanged tokens of repaired incorrect responses. The diagnostics read the
    unmasked (B,) advantages, so the naive mask's shared prefix (positive copies kept, negative ones masked)
    is a residual, and the symmetric mask (one decision per shared node) leaves none (rlcore/ibpo.py)."""
    from rlcore import ibpo

    batch = make_batch(n_groups=4, common_prefix=3)
    mask_t, gids, tokens = batch.response_mask, batch.group_ids, batch.response_ids
    repaired = batch.rewards < 1.0  # every incorrect response repaired; its revision kept the shared prefix
    edits = [
        torch.arange(int(mask_t[i].sum())) >= 3 if bool(repaired[i]) else None for i in range(len(batch))
    ]
    objective = rlcore.get_objective("cp_grpo")
    adv = ibpo.shaped_advantages(objective.config, batch.rewards, gids, mask_t, 0.5 * repaired.float(), 0.6)
    credit = ibpo.credit_mask(mask, [None if e is None else e.numpy() for e in edits], tokens, mask_t, gids)
    m = Learner(learner_spec(), tiny_model_path).train_step(batch.with_advantages(adv, credit))
    assert m["diag/d2_nodes"] > 0
    if mask == "naive":
        assert m["diag/d2_residual"] > 1e-3
    else:
        assert m["diag/d2_residual"] < 1e-5


@pytest.mark.parametrize("objective", ["dapo", "grpo"])
def test_micro_batches_sum_to_the_full_batch_gradient(learner_spec, tiny_model_path, make_batch, objective):
    """Token-mean (dapo) and per-sequence (grpo) normalisers are the whole step's, not the micro-batch's."""
    batch = make_batch(n_groups=4, objective=objective)
    whole = Learner(
        learner_spec(**{"objective.name": objective, "optim.micro_batch_size": 64}), tiny_model_path
    )
    split = Learner(
        learner_spec(**{"objective.name": objective, "optim.micro_batch_size": 4}), tiny_model_path
    )
    g_whole, g_split = whole.gradients(batch), split.gradients(batch)
    assert g_whole.keys() == g_split.keys()
    for name in g_whole:
        torch.testing.assert_close(g_split[name], g_whole[name], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("turns", ["single", "multi"])
def test_a_token_budget_cuts_micro_batches_and_keeps_the_gradient(
    learner_spec, tiny_model_path, make_batch, turns
):
    # multi: trajectories with tool output between the model's turns, counted as tree nodes by the budget
    batch = make_batch(n_groups=4) if turns == "single" else multi_turn(0, n_groups=4)
    widest = max(g.tree_tokens for g in group_spans(batch))
    budgeted = Learner(
        learner_spec(**{"optim.micro_batch_size": 64, "optim.micro_batch_tokens": 2 * widest}),
        tiny_model_path,
    )
    passes = plan_minibatches(group_spans(batch), 1, 1, budgeted.micro_limit)[0].for_rank(0)
    assert len(passes) == 2  # the budget, not the 64 rows, cuts the 4 groups: two token trees a pass
    whole = Learner(learner_spec(**{"optim.micro_batch_size": 64}), tiny_model_path)
    g_whole, g_budget = whole.gradients(batch), budgeted.gradients(batch)
    for name in g_whole:
        torch.testing.assert_close(g_budget[name], g_whole[name], rtol=1e-4, atol=1e-7)


def test_prefix_entropies_pool_over_micro_batches_by_the_positions_they_average(
    learner_spec, tiny_model_path, make_batch
):
    """D7's position-class entropies of a step split into micro-batches equal the whole batch's."""
    batch = make_batch(n_groups=4)
    batch.response_ids[0, 0] += 1  # group 0 no longer shares a prefix: its micro-batch has no common position
    got = {
        mb: Learner(learner_spec(**{"optim.micro_batch_size": mb}), tiny_model_path).train_step(batch)
        for mb in (64, 4)
    }
    assert got[64]["diag/d7_common_tokens"] > 0 and got[64]["diag/d7_shared_tokens"] > 0
    for key in (
        "diag/d7_entropy_common",
        "diag/d7_entropy_divergent",
        "diag/d7_common_tokens",
        "diag/d7_entropy_shared",
        "diag/d7_entropy_fork",
        "diag/d7_shared_tokens",
        "diag/d7_fork_rows",
    ):
        assert got[4][key] == pytest.approx(got[64][key], rel=1e-5), key


def test_save_then_load_continues_identically(learner_spec, tiny_model_path, make_batch, tmp_path):
    spec = learner_spec(
        **{
            "optim.ppo_epochs": 2,
            "optim.mini_batches": 2,
            "optim.schedule": "cosine",
            "optim.warmup_steps": 2,
            "steps": 4,
        }
    )
    batches = [make_batch(seed=s) for s in range(3)]
    first = Learner(spec, tiny_model_path)
    first.train_step(batches[0])
    first.save(tmp_path / "ck")
    expected = [first.train_step(b) for b in batches[1:]]
    resumed = Learner(spec, tiny_model_path)
    resumed.load(tmp_path / "ck")
    got = [resumed.train_step(b) for b in batches[1:]]
    for e, g in zip(expected, got, strict=True):
        assert (g["loss"], g["grad_norm"], g["lr"], g["optimizer_steps"]) == pytest.approx(
            (e["loss"], e["grad_norm"], e["lr"], e["optimizer_steps"]), rel=1e-6, abs=1e-9
        )
    torch.testing.assert_close(resumed.logprobs(batches[0]), first.logprobs(batches[0]), rtol=0, atol=1e-6)


def test_checkpoint_without_optimizer_is_smaller_and_resumes_weights_with_fresh_moments(
    learner_spec, tiny_model_path, make_batch, tmp_path
):
    batch = make_batch()
    sizes = {}
    for keep in (True, False):
        learner = Learner(learner_spec(**{"checkpoint.save_optimizer": keep}), tiny_model_path)
        learner.train_step(batch)
        learner.save(tmp_path / str(keep))
        sizes[keep] = sum(f.stat().st_size for f in (tmp_path / str(keep) / "learner").rglob("*"))
    assert sizes[False] < 0.6 * sizes[True]  # AdamW keeps two float32 moments per weight
    resumed = Learner(learner_spec(), tiny_model_path)
    resumed.load(tmp_path / "False")
    torch.testing.assert_close(resumed.logprobs(batch), learner.logprobs(batch), rtol=0, atol=0)
    assert resumed.optimizer.state_dict()["state"] == {}  # moments start afresh
    assert resumed.optimizer_steps == learner.optimizer_steps


def test_saved_model_directory_loads_in_transformers_with_the_same_logprobs(
    learner_spec, tiny_model_path, make_batch, tmp_path
):
    from transformers import AutoTokenizer

    batch = make_batch()
    learner = Learner(learner_spec(), tiny_model_path)
    learner.train_step(batch)
    learner.save(tmp_path / "ck")
    torch.testing.assert_close(
        _unsharded_logprobs(tmp_path / "ck" / "model", batch), learner.logprobs(batch), rtol=1e-5, atol=1e-5
    )
    assert AutoTokenizer.from_pretrained(tmp_path / "ck" / "model").vocab_size == 49152


def test_bf16_compute_keeps_float32_master_weights(learner_spec, tiny_model_path, make_batch):
    batch = make_batch()
    learner = Learner(learner_spec(**{"model.dtype": "bfloat16"}), tiny_model_path)
    expected = torch.bfloat16 if bf16_supported(torch.device("cpu")) else torch.float32
    assert learner.compute_dtype == expected
    before = learner.logprobs(batch)
    torch.testing.assert_close(before, _unsharded_logprobs(tiny_model_path, batch), rtol=0, atol=0.1)
    m = learner.train_step(batch)
    assert torch.isfinite(torch.tensor(m["grad_norm"])) and m["grad_norm"] > 0
    assert {p.to_local().dtype for p in learner.policy.parameters()} == {torch.float32}
    assert {v.dtype for v in learner.full_state_dict().values()} == {torch.bfloat16}  # the job's dtype


def test_activation_checkpointing_gives_the_same_gradients(learner_spec, tiny_model_path, make_batch):
    batch = make_batch()
    plain = Learner(learner_spec(), tiny_model_path).gradients(batch)
    recomputed = Learner(learner_spec(**{"optim.activation_checkpointing": True}), tiny_model_path).gradients(
        batch
    )
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], rtol=1e-5, atol=1e-7)


def test_epochs_and_mini_batches_update_off_policy(learner_spec, tiny_model_path, make_batch):
    learner = Learner(learner_spec(**{"optim.ppo_epochs": 2, "optim.mini_batches": 2}), tiny_model_path)
    m = learner.train_step(make_batch())
    assert m["optimizer_steps"] == 4
    assert "timing/old_logprobs_s" in m  # pi_old from a no-grad pass before the first update
    assert m["objective/ratio/mean"] != pytest.approx(1.0, abs=1e-7)  # later updates see moved weights


def test_lopti_objective_runs_one_update_per_stage(learner_spec, tiny_model_path, make_batch):
    learner = Learner(learner_spec(**{"objective.name": "cp_grpo_lopti"}), tiny_model_path)
    assert learner.train_step(make_batch())["optimizer_steps"] == 2


def test_reference_model_is_loaded_only_for_a_kl_term(learner_spec, tiny_model_path, make_batch):
    assert Learner(learner_spec(), tiny_model_path).reference is None
    learner = Learner(learner_spec(**{"objective.overrides": {"kl_coef": 0.1}}), tiny_model_path)
    assert learner.reference is not None
    batch = make_batch()
    first = learner.train_step(batch)
    assert first["objective/loss/kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before any update
    assert learner.train_step(batch)["objective/loss/kl"] > 1e-6


def test_train_step_refuses_a_split_group(learner_spec, tiny_model_path, make_batch):
    batch = make_batch(n_groups=2, group_size=2)
    batch.group_ids = torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match="not contiguous"):
        Learner(learner_spec(), tiny_model_path).train_step(batch)


@pytest.mark.parametrize("copies", ["equal", "per_copy"])
def test_token_tis_reaches_the_loss_and_keeps_d2_where_copies_agree(
    learner_spec, tiny_model_path, make_batch, copies
):
    """The batch's engine log-probs reach the objective (objective.overrides.behaviour_correction): cp_grpo + token
    TIS keeps D2 at rounding when copies of a shared token carry equal engine log-probs, not when they differ,
    and the step reports the spread that decides it (rlcore.offpolicy)."""
    batch = make_batch(n_groups=4, common_prefix=3)
    spec = learner_spec(**{"objective.overrides": {"behaviour_correction": "token_tis"}})
    learner = Learner(spec, tiny_model_path)
    # an engine within ~1 nat of the learner: log w = noise, so TIS caps some tokens (w > 2) and not others
    noise = 0.8 * torch.randn(batch.rollout_logprobs.shape, generator=torch.Generator().manual_seed(0))
    engine = (learner.logprobs(batch) - noise) * batch.response_mask
    if copies == "equal":  # one engine version with identical numerics: the group's first row's values
        first: dict[int, int] = {}
        for i, g in enumerate(batch.group_ids.tolist()):
            engine[i, :3] = engine[first.setdefault(g, i), :3]
    batch.rollout_logprobs.copy_(engine)
    m = learner.train_step(batch)
    assert m["objective/behaviour/corrected_frac"] > 0.05
    assert m["mismatch/shared_pairs"] > 0 and m["diag/d2_nodes"] > 0
    if copies == "equal":
        assert m["mismatch/shared_spread_max"] == 0 and m["diag/d2_residual"] < 1e-5
    else:
        assert m["mismatch/shared_spread_max"] > 0.1 and m["diag/d2_residual"] > 1e-3


def test_the_host_reads_a_micro_batch_before_its_backward_is_queued(
    learner_spec, tiny_model_path, make_batch, monkeypatch
):
    """On a GPU a host read waits for every kernel queued before it, so the diagnostics' inputs are copied to
    the host before the model's backward is queued and the diagnostics then run on those copies while the
    device works (the learner's _micro_step)."""
    from tgc_rl.learner import learner as learner_module

    events: list[tuple[str, object]] = []
    to_host, backward = learner_module.DiagnosticInputs.to_host, torch.autograd.backward
    diagnostics = rlcore.cancellation_diagnostics

    def recording_to_host(*args, **kwargs):
        x = to_host(*args, **kwargs)
        events.append(("to_host", x))
        return x

    def recording_backward(*args, **kwargs):
        events.append(("backward", None))
        return backward(*args, **kwargs)

    def recording_diagnostics(w, *args, **kwargs):
        events.append(("diagnostics", w))
        return diagnostics(w, *args, **kwargs)

    monkeypatch.setattr(learner_module.DiagnosticInputs, "to_host", recording_to_host)
    monkeypatch.setattr(torch.autograd, "backward", recording_backward)
    monkeypatch.setattr(rlcore, "cancellation_diagnostics", recording_diagnostics)
    learner = Learner(learner_spec(**{"optim.micro_batch_size": 4}), tiny_model_path)
    m = learner.train_step(make_batch(n_groups=3))
    assert [e for e, _ in events] == ["to_host", "backward", "diagnostics"] * 3  # one triple per micro-batch
    for i in range(0, len(events), 3):
        host, w = events[i][1], events[i + 2][1]
        assert w is host.w and not w.requires_grad and w.device.type == "cpu"
    assert abs(m["diag/d2_residual"]) < 1e-6  # cp_grpo: the diagnostics still read the right weights
