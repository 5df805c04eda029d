"""Part 6 of the GPU check: the Markdown summary of the parts' JSON, tables ready for
BENCHMARKS.md (the sampling table has the columns of its bench-sampler tables)."""

from __future__ import annotations


def _fmt(value, spec: str = ".3g", none: str = "-") -> str:
    if value is None:
        return none
    return (
        format(value, spec)
        if isinstance(value, int | float) and not isinstance(value, bool)
        else str(value)
    )


def table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows]


def machine_table(env: dict, install: dict) -> list[str]:
    """One row: the GPU, its memory, driver, torch, CUDA, cuDNN, Python, the commit and the
    optional CUDA packages; then what the installs did."""
    packages = env.get("packages") or {}
    memory = f"{env['memory_gib']} GiB" if env.get("memory_gib") else "-"
    row = [
        env.get("device_name", "?"),
        memory,
        env.get("driver", "-"),
        env.get("torch"),
        env.get("cuda"),
        env.get("cudnn"),
        env.get("python"),
        env.get("commit"),
        packages.get("flash-attn") or "not installed",
        packages.get("mamba-ssm") or "not installed",
    ]
    lines = table(
        [
            "GPU",
            "memory",
            "driver",
            "torch",
            "CUDA",
            "cuDNN",
            "Python",
            "commit",
            "flash-attn",
            "mamba-ssm",
        ],
        [[_fmt(c) for c in row]],
    )
    if install:
        lines += ["", "Installs: " + "; ".join(f"{k} {v}" for k, v in install.items()) + "."]
    return lines


def parts_table(results: list[dict]) -> list[str]:
    return table(
        ["part", "status", "seconds", "result"],
        [
            [
                r.get("title", r["part"]),
                r["status"],
                _fmt(r.get("seconds"), ".0f"),
                r.get("headline") or r.get("reason") or "",
            ]
            for r in results
        ],
    )


def pytest_section(r: dict) -> list[str]:
    cases = r.get("cases", [])
    if not cases:
        return []
    return ["### 1. pytest tests/gpu", ""] + table(
        ["test", "outcome", "seconds", "message"],
        [
            [c["name"], c["outcome"], _fmt(c.get("seconds"), ".1f"), c.get("message", "")[:120]]
            for c in cases
        ],
    )


def parity_section(r: dict) -> list[str]:
    rows = [
        [
            x["path"],
            _fmt(x.get("max_abs_diff")),
            _fmt(x.get("mean_abs_diff")),
            _fmt(x.get("max_rel_diff")),
            _fmt(x.get("argmax_agreement"), ".4f"),
            x.get("error", ""),
        ]
        for x in r.get("rows", [])
    ]
    if not rows:
        return []
    head = (
        f"### 2. Logits against the CPU fp32 forward ({r.get('model')}, random weights, "
        f"batch {r.get('batch')} x L = {r.get('length')})"
    )
    return [head, ""] + table(
        [
            "path",
            "max abs diff",
            "mean abs diff",
            "max diff / max logit",
            "argmax agreement",
            "error",
        ],
        rows,
    )


def _train_row(x: dict) -> list:
    mfu = x.get("mfu")
    return [
        _fmt(x.get("micro_batch")),
        "out of memory" if x.get("oom") else _fmt(x.get("tokens_per_s"), ",.0f"),
        _fmt(x.get("tflops"), ".1f"),
        "-" if mfu is None else f"{100 * mfu:.1f}%",
        _fmt(x.get("peak_memory_gib"), ".1f"),
    ]


def throughput_section(r: dict) -> list[str]:
    if not r.get("rows"):
        return []
    peak = r.get("peak")
    against = f"{peak[0]}, {peak[1]} TFLOP/s bf16 dense" if peak else "no known peak"
    out = [
        f"### 3. Training throughput: preset {r.get('preset')}'s DiT at L = {r.get('length')}, "
        f"random tokens (MFU against {against})",
        "",
        f"FLOPs per token: {_fmt(r.get('flops_per_token'), '.4g')} ({r.get('flops_formula')}).",
        "",
    ]
    out += table(
        ["compiled", "micro-batch", "tokens/s", "TFLOP/s", "MFU", "peak memory GiB", "warm-up s"],
        [[str(x["compiled"]), *_train_row(x), _fmt(x.get("warmup_s"), ".1f")] for x in r["rows"]],
    )
    if r.get("search"):
        out += [
            "",
            "Micro-batch search (eager, doubling): largest that fits "
            f"{r.get('largest_micro_batch')}" + (" (the cap)" if r.get("search_capped") else ""),
            "",
        ]
        out += table(
            ["micro-batch", "tokens/s", "TFLOP/s", "MFU", "peak memory GiB"],
            [_train_row(x) for x in r["search"]],
        )
    return out


def sampling_section(r: dict) -> list[str]:
    out = [
        f"### 4. Sampling: {r.get('model')} (random weights), L = {r.get('length')}, "
        f"{r.get('dtype')}",
        "",
    ]
    rows = [
        [
            x["precision"],
            x["sampler"],
            _fmt(x.get("steps")),
            x["batch_size"],
            _fmt(x["seconds_per_sample"], ".3f"),
            _fmt(x["tokens_per_second"], ",.0f"),
            _fmt(x["nfe"], ".1f"),
            _fmt(x.get("nfe_whole_batch"), ".1f"),
            _fmt(x["ncs"], ".1f"),
            _fmt(x["calls_per_s"], ".1f"),
            f"{100 * x['overhead_share']:.1f}%",
        ]
        for x in r.get("rows", [])
    ]
    if rows:
        out += table(
            [
                "precision",
                "sampler",
                "steps",
                "batch",
                "s/sample",
                "tokens/s",
                "NFE",
                "NFE whole-batch",
                "NCS",
                "network calls/s",
                "overhead",
            ],
            rows,
        ) + [""]
    return out + draw_section(r)


def draw_section(r: dict) -> list[str]:
    """Milliseconds of one draw over the vocabulary, and of one network call."""
    out: list[str] = []
    draws = r.get("draws", [])
    by_rows = {d["rows"]: {} for d in draws}
    for d in draws:
        by_rows[d["rows"]][d["precision"]] = d["ms"]
    if by_rows:
        out += [
            f"One categorical draw over V = {r.get('vocab', 50258):,} (ms) "
            "next to one network call:",
            "",
        ]
        out += table(
            ["rows drawn", "fp64 ms", "fp32 ms"],
            [
                [n, _fmt(p.get("fp64"), ".4f"), _fmt(p.get("fp32"), ".4f")]
                for n, p in by_rows.items()
            ],
        )
        out += [""] + table(
            ["network call, batch", "ms"],
            [[n["batch"], _fmt(n["ms"], ".3f")] for n in r.get("network", [])],
        )
    return out


def ddp_section(r: dict) -> list[str]:
    rows = [
        [
            x["parallel"],
            x.get("backend", "-"),
            x.get("wrapped_as", "-"),
            _fmt(x.get("steps")),
            _fmt(x.get("tokens_per_s"), ",.0f"),
            _fmt(x.get("loss_first"), ".4f"),
            _fmt(x.get("loss_last"), ".4f"),
            _fmt(x.get("seconds"), ".1f"),
            x.get("error", ""),
        ]
        for x in r.get("rows", [])
    ]
    if not rows:
        return []
    return [
        "### 5. torchrun --nproc-per-node 1: mdlm train through DDP and FSDP2 (one-rank group)",
        "",
    ] + table(
        [
            "parallel",
            "backend",
            "wrapped as",
            "steps",
            "tokens/s",
            "first loss",
            "last loss",
            "seconds",
            "error",
        ],
        rows,
    )


def render(env: dict, install: dict, results: list[dict]) -> str:
    """The whole summary: the machine, one row per part, then each part's table."""
    by_part = {r["part"]: r for r in results}
    out = [
        f"## GPU check{' (dry run, CPU)' if env.get('dry_run') else ''}: "
        f"{env.get('device_name', '?')}",
        "",
        *machine_table(env, install),
        "",
    ]
    out += parts_table(results)
    for name, section in (
        ("pytest", pytest_section),
        ("parity", parity_section),
        ("throughput", throughput_section),
        ("sampling", sampling_section),
        ("ddp", ddp_section),
    ):
        if name in by_part:
            lines = section(by_part[name])
            out += ([""] + lines) if lines else []
    return "\n".join(out) + "\n"
