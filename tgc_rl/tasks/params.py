"""What the built-in tasks' params models share: the `TaskParams` base, the template helpers, the sandbox and
verifier choices, and `validate_params`, which turns a validation error into `task.params.<field>` lines.

Each task's own params model lives in its module, next to its `Task` subclass (tgc_rl.tasks.registry says which
module each task is). A spec that the API accepts must be one that can start, so the control plane validates
`task.params` against those models at submit time (the same models build the task on the worker), and `tgc
schema` publishes them. Fields that only the operator may switch carry `json_schema_extra=needs_grant(...)`
(tgc_rl.tasks.grants.privileged_fields lists those set).

This module imports pydantic only, so the control plane and the SDK can use it.
"""

from __future__ import annotations

import re
import typing
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.json_schema import JsonDict

MAX_TEMPLATE_CHARS = 4096


class TaskParams(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


def needs_grant(privilege: str) -> JsonDict:
    """A field's `json_schema_extra`: setting it away from its default needs the operator's `privilege`."""
    return {"privilege": privilege}


# A slot is `{name}`; any other brace is matched too, so that check_template can name what it is. Linear.
_BRACES = re.compile(r"\{([^{}]*)\}|[{}]")
_AFTER_NAME = re.compile(r"\w*([:!.\[])")


def check_template(template: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> str:
    """Refuse anything in braces but a `{name}` slot of `allowed`, and a missing `required` slot.

    Templates are filled by `fill_template` (literal substitution), never by `str.format`: a format spec
    (`{prompt:>2000000000}`, a width chosen by a value) would cost unbounded memory and a conversion or an
    attribute or index would reach Python objects, so each is refused here, with what to write instead.
    """
    slots = ", ".join("{" + a + "}" for a in allowed)
    seen = set()
    for m in _BRACES.finditer(template):
        inner = m.group(1)
        if inner in allowed:
            seen.add(inner)
            continue
        at = f"{template[m.start() : m.start() + 40]!r} at character {m.start()}"
        # what follows the slot's name says what str.format would have read there
        after = _AFTER_NAME.match(template, m.start() + 1) if m.group(0)[0] == "{" else None
        why = {
            ":": "a format spec (no width, fill or precision: slots are filled literally)",
            "!": "a conversion (slots are filled literally)",
            ".": "attribute access (slots are filled literally)",
            "[": "index access (slots are filled literally)",
        }.get(after.group(1) if after else "", "a lone brace" if inner is None else "an unknown slot")
        raise ValueError(
            f"{at}: {why}; braces may only enclose a slot ({slots}), written exactly so, "
            "and there is no escape for a literal brace"
        )
    missing = [r for r in required if r not in seen]
    if missing:
        raise ValueError(
            f"missing the slot(s) {', '.join('{' + r + '}' for r in missing)}; the slots are {slots}"
        )
    return template


def fill_template(template: str, **values: object) -> str:
    """Substitute each `{name}` slot of `values` literally, in one pass over the template: a value is never
    read as a template (a response holding `{references}` stays as written), a template never reaches
    attributes or format specs the way `str.format` does, and anything else in braces stays as typed."""
    return _BRACES.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template)


SandboxMode = Literal["bwrap", "unsafe_local"]
SANDBOX_DOC = (
    "`bwrap` (default): model-written code runs in the bubblewrap sandbox. `unsafe_local` runs it "
    "WITHOUT isolation; only the operator can allow it (server setting or admin token)."
)

Verifier = Literal["math", "exact", "regex", "code"]
VERIFIERS: tuple[str, ...] = typing.get_args(Verifier)


M = TypeVar("M", bound=BaseModel)


def validate_params(model: type[M], params: dict[str, Any], field: str = "task.params") -> M:
    """`params` as `model`; raises ValueError whose lines start with `<field>.<name>` (task.params.<name>)."""
    try:
        return model.model_validate(params)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"])
            msg = (
                "unknown field; known: " + ", ".join(model.model_fields)
                if err["type"] == "extra_forbidden"
                else str(err["msg"]).removeprefix("Value error, ")
            )
            lines.append(f"{field}.{loc}: {msg}" if loc else f"{field}: {msg}")
        raise ValueError("; ".join(lines)) from None
