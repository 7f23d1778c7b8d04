"""RolloutSpec: a rollout replica's slice of the job spec, built once on the driver."""

from tests.rollout.rollout_helpers import rollout_spec
from tgc_rl.config import JobSpec
from tgc_rl.rollout import RolloutSpec


def test_a_replica_gets_its_fields_with_host_dependent_choices_unresolved():
    job = rollout_spec("auto", dtype="auto", temperature=0.7)
    spec = RolloutSpec.of(job)
    assert spec.engine == "auto" and spec.model.dtype == "auto"  # each replica resolves them on its host
    assert spec.sampling.temperature == 0.7 and spec.seed == job.seed and not spec.broadcast
    assert not any(isinstance(v, JobSpec) for v in vars(spec).values())
    assert not {"task", "optim", "resources", "objective"} & set(vars(spec))
