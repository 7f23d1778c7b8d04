"""The `ibpo` section of the job spec: defaults, ranges, the revision template and the ibpo_cp preset."""

import pytest

from services.config import JobSpec, SpecError


def test_ibpo_is_off_unless_asked_for():
    assert JobSpec.parse({}).ibpo is None
    spec = JobSpec.parse({"ibpo": {}})
    assert (
        spec.ibpo.enabled and spec.ibpo.rho == 0.5 and spec.ibpo.lambda_ is None and spec.ibpo.mask == "none"
    )


def test_objective_ibpo_cp_turns_ibpo_on_with_the_symmetric_mask():
    spec = JobSpec.parse({"objective": {"name": "ibpo_cp"}})
    assert spec.ibpo is not None and spec.ibpo.enabled and spec.ibpo.mask == "symmetric"
    # an explicit section wins, and the spec round-trips
    spec = JobSpec.parse({"objective": {"name": "ibpo_cp"}, "ibpo": {"mask": "naive", "rho": 1.0}})
    assert spec.ibpo.mask == "naive" and JobSpec.parse(spec.to_dict()) == spec


@pytest.mark.parametrize(
    "section, message",
    [
        ({"mask": "half"}, "ibpo.mask"),
        ({"rho": -1}, "ibpo.rho"),
        ({"references": 0}, "ibpo.references"),
        ({"revision_template": "{prompt} {response}"}, "exactly the fields"),
        ({"revision_template": "{prompt} {response} {references} {x}"}, "exactly the fields"),
        ({"revision_template": "{prompt {response} {references}"}, "literal brace"),
        ({"max_new_tokens": 65}, "ibpo.max_new_tokens"),
        ({"unknown": 1}, "unknown field"),
    ],
)
def test_bad_ibpo_sections_are_refused_naming_the_field(section, message):
    with pytest.raises(SpecError, match=message):
        JobSpec.parse({"ibpo": section, "sampling": {"max_new_tokens": 64}})
