"""`mdlm reproduce --emit slurm`: one job script per training run, one per evaluation row, and a
submit script chaining them with SLURM dependencies (the conventions of the SLURM example in
docs/training.md)."""

from __future__ import annotations

import shlex
from pathlib import Path

from .plan import Job

TRAIN = """#!/bin/bash
#SBATCH --job-name=mdlm-{name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={gpus}
#SBATCH --cpus-per-task=64
#SBATCH --time=24:00:00
#SBATCH --signal=TERM@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={logs}/%x.out

head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node {gpus} \\
    --rdzv-backend c10d --rdzv-endpoint "$head:29500" --rdzv-id "$SLURM_JOB_ID" \\
    -m mdlm_cli {args}
"""
STEP = """#!/bin/bash
#SBATCH --job-name=mdlm-{name}
#SBATCH --nodes=1
#SBATCH --gpus-per-node=1
#SBATCH --time=12:00:00
#SBATCH --output={logs}/%x.out

{commands}
"""


def emit(jobs: list[Job], folder: Path, *, nodes: int = 1, gpus: int = 8) -> Path:
    """Write the scripts under `folder`; returns submit.sh. A training job that reaches its time
    limit is requeued and resumes (--resume); fine-tunes wait for their base run and evaluations
    for their model (afterok)."""
    folder.mkdir(parents=True, exist_ok=True)
    logs = folder / "logs"
    submit = [
        "#!/bin/bash",
        "# Submit the training runs, then each row's evaluation once its model is trained.",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        f"mkdir -p {shlex.quote(str(logs))}",
    ]
    trained: dict[str, str] = {}  # run folder -> shell variable holding the job id
    for job in (j for j in jobs if j.kind == "train"):
        script = folder / f"train-{job.name}.sbatch"
        script.write_text(TRAIN.format(name=job.name, nodes=nodes, gpus=gpus, logs=logs,
                                       args=" ".join(map(shlex.quote, job.argv))))
        var = f"train_{len(trained)}"
        # a fine-tune waits for the run it starts from (planned before it)
        after = [trained[run] for run in job.needs if run in trained]
        dependency = f"--dependency=afterok:{':'.join('$' + v for v in after)} " if after else ""
        trained[str(job.output)] = var
        submit.append(f"{var}=$(sbatch --parsable {dependency}{script.name})")
    by_row: dict[str, list[Job]] = {}
    for job in (j for j in jobs if j.kind == "step"):
        by_row.setdefault(job.rows[0], []).append(job)
    for row, steps in by_row.items():
        script = folder / f"eval-{row}.sbatch"
        script.write_text(
            STEP.format(name=row, logs=logs, commands="\n".join(j.command() for j in steps))
        )
        needs = sorted({trained[run] for j in steps for run in trained if run in j.argv})
        dependency = f"--dependency=afterok:{':'.join('$' + v for v in needs)} " if needs else ""
        submit.append(f"sbatch {dependency}{script.name}")
    path = folder / "submit.sh"
    path.write_text("\n".join(submit) + "\n")
    path.chmod(0o755)
    return path
