"""The `ibpo` section of the job spec: defaults, ranges, the revision template and the ibpo_cp preset."""

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlcore
from tgc_rl.config import DEFAULT_REVISION_TEMPLATE, REVISION_SLOTS, IbpoSpec, JobSpec, SpecError
from tgc_rl.models import load_tokenizer
from tgc_rl.tasks import TaskItem
from tgc_rl.tasks.params import check_template, fill_template
from tgc_rl.trainer.ibpo import Reviser

from .conftest import tiny_spec


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
        ({"revision_template": "{prompt} {response}"}, "missing the slot"),
        ({"revision_template": "{prompt} {response} {references} {x}"}, "unknown slot"),
        ({"revision_template": "{prompt {response} {references}"}, "lone brace"),
        ({"max_new_tokens": 65}, "ibpo.max_new_tokens"),
        ({"unknown": 1}, "unknown field"),
    ],
)
def test_bad_ibpo_sections_are_refused_naming_the_field(section, message):
    with pytest.raises(SpecError, match=message):
        JobSpec.parse({"ibpo": section, "sampling": {"max_new_tokens": 64}})


# -- the revision template: filled by literal slot substitution, like the task templates ---------------
SLOTS = "{response} {references}"
HOSTILE_TEMPLATES = {
    "{prompt:>2000000000} " + SLOTS: "format spec",  # str.format built a 2 GB string per revision
    "{prompt:{response}} " + SLOTS: "format spec",  # the model's own output chose the width
    "{prompt!r} " + SLOTS: "conversion",
    "{prompt.__class__} " + SLOTS: "attribute access",
    "{prompt[0]} " + SLOTS: "index access",
    "{{prompt}} " + SLOTS: "lone brace",  # no escapes: a literal brace is refused, not half-read
    "{prompt} {response} {references} }": "lone brace",
}


@pytest.mark.parametrize("template", list(HOSTILE_TEMPLATES))
def test_format_specs_conversions_and_attributes_are_refused_naming_the_field(template):
    with pytest.raises(SpecError) as e:
        JobSpec.parse({"ibpo": {"revision_template": template}})
    (line,) = [ln.strip() for ln in str(e.value).splitlines() if "revision_template" in ln]
    assert line.startswith("ibpo.revision_template: ") and HOSTILE_TEMPLATES[template] in line, line
    assert "braces may only enclose a slot ({prompt}, {response}, {references})" in line  # the fix


def test_the_trainer_fills_the_template_literally_whatever_reaches_it():
    spec = tiny_spec(ibpo={})
    tok = load_tokenizer(spec.model)
    reviser = Reviser(spec, tok, rlcore.get_objective(spec.objective.name))
    # a template that never passed validation (an old stored spec): its format spec stays text, never a width
    reviser.cfg = IbpoSpec.model_construct(
        **{**reviser.cfg.model_dump(), "revision_template": "{prompt:>60}|" + SLOTS}
    )
    item = TaskItem(id="t", prompt="P {response}")
    text = tok.decode(reviser.revision_prompt(item, "R {references} {prompt:>99}", ["C1", "C2"]))
    # values are never read as templates: a response holding {references} or a format spec stays as written
    assert "{prompt:>60}|R {references} {prompt:>99} C1\n\n---\n\nC2" in text, text
    assert " " * 20 not in text


TEMPLATE_TEXT = st.lists(
    st.sampled_from([*"{}:!.[]0>x pr", "{prompt}", "{response}", "{references}"]), max_size=40
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(pieces=TEMPLATE_TEXT, values=st.tuples(*[st.text(alphabet="{}xr:>9", max_size=12)] * 3))
def test_an_accepted_template_fills_to_its_slots_values_and_nothing_more(pieces, values):
    template = "".join(pieces)
    outside_slots = re.sub(r"\{(prompt|response|references)\}", "", template)
    try:
        check_template(template, REVISION_SLOTS)
    except ValueError:
        assert "{" in outside_slots or "}" in outside_slots  # refused only for a brace outside a slot
        return
    assert "{" not in outside_slots and "}" not in outside_slots
    filled = fill_template(template, **dict(zip(REVISION_SLOTS, values, strict=True)))
    # the cost of a fill is linear: the template's text plus each slot's value, once per slot
    counts = [template.count("{" + s + "}") for s in REVISION_SLOTS]
    slots_len = sum(c * (len(s) + 2) for c, s in zip(counts, REVISION_SLOTS, strict=True))
    assert len(filled) == len(template) - slots_len + sum(
        c * len(v) for c, v in zip(counts, values, strict=True)
    )
    # and it is what a reader expects: split on the slots, join with the values
    pieces = re.split(r"\{(prompt|response|references)\}", template)
    expected = "".join(
        p if i % 2 == 0 else dict(zip(REVISION_SLOTS, values, strict=True))[p] for i, p in enumerate(pieces)
    )
    assert filled == expected


def test_the_default_template_is_accepted_and_fills_every_slot():
    filled = fill_template(DEFAULT_REVISION_TEMPLATE, prompt="P", response="R", references="C")
    assert "{" not in filled and all(x in filled for x in ("P", "R", "C"))
