"""Where an ExecuTorch runner program's time goes: our ``executorch_llm`` bundle's ``model.pte`` against
``export_llama``'s, as ``llm_runner_side_by_side.py --work DIR`` left them in DIR.

For each program: its structure (delegate calls and the operators it calls outside them, from the serialized
plan) and an ETDump profile (ExecuTorch's event tracer, read with ``executorch.devtools.Inspector``) of ``--repeats``
sequences of one prefill of ``--prompt-tokens`` rows and ``--steps`` one-token decode calls, on ``--threads``
XNNPACK threads. Per call kind (prefill, decode), each event's median over the sequences, summed by category:
XNNPACK fully-connected operators, other XNNPACK operators, the rest of the delegate calls' time (the XNNPACK
runtime's reshape and setup on every call, since the row count is dynamic), the operators outside delegates, and
the whole ``Method::execute``. The programs are profiled one after the other, so on a shared machine compare
categories within one program and ratios loosely across them.

    python benchmarks/llm_runner_profile.py --reuse DIR --out benchmarks/results/llm_runner_profile.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

PROGRAMS = {"ours executorch_llm fp32": "etl_fp32/model.pte",
            "executorch export_llama xnnpack fp32": "smollm2_fp32.pte"}  # in an llm_runner_side_by_side.py --work DIR
OUTSIDE = ("native_call", "llama::")  # event names of operators run outside delegates


def structure(pte: Path) -> dict:
    """Delegate calls and the calls of each operator outside delegates in the program's ``forward``."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    plan = deserialize_pte_binary(pte.read_bytes()).program.execution_plan[0]
    kinds = [type(i.instr_args).__name__ for i in plan.chains[0].instructions]
    ops = Counter(plan.operators[i.instr_args.op_index].name
                  for i, k in zip(plan.chains[0].instructions, kinds) if k == "KernelCall")
    return {"delegate_calls": kinds.count("DelegateCall"), "calls_outside_delegates": sum(ops.values()),
            "outside_by_operator": dict(ops.most_common())}


def etdump(pte: Path, rows: int, steps: int, repeats: int, threads: int, out: Path) -> None:
    import importlib

    import torch
    from executorch.extension.pybindings import portable_lib

    importlib.import_module("executorch.extension.llm.custom_ops.custom_ops")  # registers the llama:: kernels

    portable_lib._unsafe_reset_threadpool(threads)
    m = portable_lib._load_for_executorch(str(pte), enable_etdump=True)
    prompt = [1] + list(range(300, 300 + rows - 1))
    for _ in range(repeats):
        m.forward([torch.tensor([prompt]), torch.tensor([0])])
        for i in range(steps):
            m.forward([torch.tensor([[400 + i]]), torch.tensor([rows + i])])
    m.write_etdump_result_to_file(str(out))


def categories(path: Path, steps: int) -> dict:
    """ms per call kind and category: each event's median over the sequences, summed."""
    from executorch.devtools import Inspector

    block = next(b for b in Inspector(etdump_path=str(path)).event_blocks if b.name == "Execute")
    out = {k: defaultdict(float) for k in ("prefill", "decode")}
    for ev in block.events:
        if ev.perf_data is None:
            continue
        t = ev.perf_data.raw
        runs = {"prefill": [x for i, x in enumerate(t) if i % (steps + 1) == 0],
                "decode": [x for i, x in enumerate(t) if i % (steps + 1) != 0]}
        name = ev.name
        cat = ("execute" if name == "Method::execute" else "delegate_calls" if name == "DELEGATE_CALL"
               else "outside_delegates" if name.startswith(OUTSIDE) else None if name == "OPERATOR_CALL"
               else "xnnpack_fully_connected" if name.startswith("Fully Connected") else "xnnpack_other")
        if cat is None:
            continue
        for kind, xs in runs.items():
            out[kind][cat] += statistics.median(xs)
    for c in out.values():
        c["delegate_overhead"] = c["delegate_calls"] - c["xnnpack_fully_connected"] - c["xnnpack_other"]
    return {k: {c: round(v, 3) for c, v in sorted(d.items())} for k, d in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reuse", type=Path, required=True, help="an llm_runner_side_by_side.py --work directory")
    ap.add_argument("--out", type=Path, default=Path("llm_runner_profile.json"))
    ap.add_argument("--prompt-tokens", type=int, default=20)
    ap.add_argument("--steps", type=int, default=8, help="decode calls after each prefill")
    ap.add_argument("--repeats", type=int, default=6, help="sequences (prefill + steps) profiled")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    from llm_runner_side_by_side import _shown  # sibling

    from omni_export.artifacts.atomic import write_json_atomic
    from omni_export.artifacts.provenance import git_revision, toolchain

    load_start, rows = os.getloadavg(), {}
    with tempfile.TemporaryDirectory(prefix="llm-runner-profile-") as tmp:
        for label, rel in PROGRAMS.items():
            pte = a.reuse / rel
            dump = Path(tmp) / f"{len(rows)}.etdp"
            etdump(pte, a.prompt_tokens, a.steps, a.repeats, a.threads, dump)
            rows[label] = {"structure": structure(pte), "ms": categories(dump, a.steps)}
    result = {"benchmark": "ExecuTorch runner programs: structure and ETDump time by category",
              "command": " ".join(["python", *map(_shown, sys.argv)]),
              "figure": "ms per call: each event's median over the sequences, summed by category",
              "toolchain": toolchain(), "source_revision": git_revision(), "programs": rows,
              "machine_load": {"loadavg_start": [round(x, 2) for x in load_start],
                               "loadavg_end": [round(x, 2) for x in os.getloadavg()]}}
    write_json_atomic(a.out, result)
    for label, r in rows.items():
        print(label, r["structure"]["delegate_calls"], "delegates,", r["structure"]["calls_outside_delegates"],
              "calls outside")
        for kind, c in r["ms"].items():
            print("  ", kind, c)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
