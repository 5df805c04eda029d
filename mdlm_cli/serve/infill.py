"""`POST /v1/mdlm/infill`: a template with `<mask>` and `<mask:N>` spans, the fixed text kept
and the spans filled (`mdlm sample --infill` behind HTTP)."""

from __future__ import annotations

from ..errors import MdlmError
from ..sample.generate import template
from .fields import check_fields, check_model, common_fields, get_value
from .schema import (
    BLOCKS_ONLY,
    INFILL_FIELDS,
    Limits,
    Plan,
    Row,
    check_states,
    invalid,
    make_plan,
)
from .served import Served


def parse_infill(body: dict, served: Served, limits: Limits) -> Plan:
    """`POST /v1/mdlm/infill`: a template with `<mask>` and `<mask:N>` spans (`sample
    --infill`)."""
    check_fields(body, INFILL_FIELDS)
    check_model(body, served)
    loaded = served.loaded
    if loaded.objective.causal:
        raise invalid(f"a left-to-right ({loaded.objective.name}) model cannot infill",
                      "template")
    if served.block_size:
        raise invalid(BLOCKS_ONLY.format(what="cannot infill a template"), "template")
    text = get_value(body, "template", (str,), None, "a string with <mask> or <mask:N> spans")
    if text is None:
        raise invalid("template is required: text with <mask> or <mask:N> spans", "template")
    try:
        fixed = template(loaded, loaded.length, infill=text)
    except MdlmError as e:
        raise invalid(
            str(e).replace("--infill", "template").replace("--length", "the model's length"),
            "template",
            "context_length_exceeded" if "length" in str(e) else None,
        ) from None
    start = len(loaded.row_start())
    n_fixed = int((fixed[start:] != loaded.mask_id).sum())
    row = Row(fixed, fixed[:start].tolist(), n_fixed)
    common = common_fields(body, served, limits, "infill")
    return check_states(make_plan(common, [row],
                                  max_new_tokens=int((fixed == loaded.mask_id).sum())))
