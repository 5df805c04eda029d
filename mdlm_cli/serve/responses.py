"""The shapes of the server's answers that every endpoint shares: the `mdlm` block of a
response, OpenAI's usage counts, object names and ids, and server-sent event lines."""

from __future__ import annotations

import json
import uuid

from .generation import Outcome
from .schema import Plan
from .worker import Job


def mdlm_info(plan: Plan, outcome: Outcome, job: Job) -> dict:
    queued = (job.started or job.submitted) - job.submitted
    info = {"sampler": plan.sampler.name, "steps": plan.steps, "seed": plan.seed,
            "precision": plan.precision, "top_k": plan.settings.top_k or 0,
            "nfe": outcome.stats.nfe, "ncs": outcome.stats.ncs,
            "network_calls": outcome.stats.calls, "seconds": round(outcome.seconds, 6),
            "queue_seconds": round(queued, 6), **plan.options}
    if plan.stride is not None:
        info["stride"] = plan.stride
    if outcome.batch is not None:
        info["batch"] = outcome.batch
    return info


def usage(outcome: Outcome) -> dict:
    return {"prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
            "total_tokens": outcome.prompt_tokens + outcome.completion_tokens}


OBJECTS = {"completion": "text_completion", "infill": "mdlm.infill", "chat": "chat.completion"}


def object_name(plan: Plan, chunk: bool = False) -> str:
    return OBJECTS[plan.endpoint] + (".chunk" if chunk and plan.endpoint == "chat" else "")


def response_id(plan: Plan) -> str:
    return f"{'chatcmpl' if plan.endpoint == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
