"""LearnerSpec: a learner rank's slice of the job spec, built once on the driver."""

from tgc_rl.config import JobSpec
from tgc_rl.learner import LearnerSpec


def test_a_rank_gets_its_fields_and_no_part_of_the_job_it_does_not_use(tiny_spec):
    job = tiny_spec(**{"model.dtype": "auto", "optim.lr": 3e-4, "resources.threads_per_actor": 3})
    spec = LearnerSpec.of(job)
    assert spec.model_dtype == "auto"  # resolved by the rank on its own host, not by whoever parsed the spec
    assert spec.optim.lr == 3e-4 and spec.threads == 3 and spec.group_size == job.group_size
    assert spec.temperature == job.sampling.temperature and spec.objective == job.objective.name
    assert not any(isinstance(v, JobSpec) for v in vars(spec).values())
    assert not {"task", "resources", "eval", "ibpo", "name"} & set(vars(spec))
