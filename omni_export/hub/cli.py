"""``omni-export hub submit`` (compile, profile, on-device parity for stored artifacts) and ``omni-export hub devices``."""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..errors import EXIT_BLOCKED, EXIT_OK


def _connect_arg(p) -> None:
    from ..commands.options import positive_seconds
    from .client import CONNECT_SECONDS

    p.add_argument("--connect-timeout", type=positive_seconds, default=CONNECT_SECONDS,
                   help="seconds the service may take to answer a call before it counts as unreachable "
                        "(default: %(default)s)")


def register(subparsers, store_arg) -> None:
    hub = subparsers.add_parser("hub", help="Qualcomm AI Hub: compile, profile and verify stored artifacts on real phones")
    sub = hub.add_subparsers(dest="hub_command", required=True)

    p = sub.add_parser("submit", help="compile + profile + on-device parity for a recipe's stored artifacts")
    p.add_argument("--recipe", required=True, help="the recipe the store was built with (name or .yaml path)")
    p.add_argument("--device", default=None,
                   help="galaxy_s25 / galaxy_s24 (or chipset SM8750 / SM8650), or any device name AI Hub lists "
                        "(default: the recipe's device)")
    p.add_argument("--artifact", action="append", help="artifact id (repeatable; default: every published QDQ artifact)")
    p.add_argument("--target-runtime", default="qnn_context_binary", choices=("qnn_context_binary", "qnn_dlc"))
    p.add_argument("--qairt-version", help="QAIRT version for the compile/profile/inference jobs (default: the service's)")
    from ..commands.options import model_args, positive_int, positive_seconds
    p.add_argument("--steps", type=positive_int, help="teacher-forced steps sent to the device (default: the recipe's simulator budget)")
    model_args(p)  # the model the recipe was run with
    p.add_argument("--poll-seconds", type=positive_seconds, default=10.0, help="seconds between job status polls")
    p.add_argument("--timeout-seconds", type=positive_seconds, default=3 * 3600.0,
                   help="stop waiting after this long (jobs keep running; a rerun resumes)")
    p.add_argument("--dry-run", action="store_true", help="print the jobs that would be submitted; contact nothing")
    _connect_arg(p)
    store_arg(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("devices", help="list the devices AI Hub offers (needs the qai-hub client configured)")
    _connect_arg(p)
    p.set_defaults(func=cmd_devices)


def cmd_submit(args: argparse.Namespace, console: Console) -> int:
    from ..artifacts.store import Store
    from ..recipes import load_recipe
    from . import jobs as J
    from . import payload as P
    from .client import HubSession
    from .ledger import Ledger

    requested = load_recipe(args.recipe).with_overrides(preset=args.preset, seed=args.seed, checkpoint=args.checkpoint,
                                                        context=args.context, option=args.option)
    store = Store(Path(args.store))
    device = P.resolve_device(args.device or requested.device)
    arts = P.select_artifacts(store, requested.name, args.artifact)
    recipe = P.pinned_recipe(store, arts, requested)  # components, prompts and thresholds of the recipe that built them
    steps = args.steps if args.steps is not None else recipe.parity.simulator_steps
    opts = P.Options(args.target_runtime, args.qairt_version, steps, args.poll_seconds, args.timeout_seconds)
    ledger = Ledger(store.root)

    if args.dry_run:
        console.print(f"AI Hub jobs for {recipe.name} on {device.hub_name!r} (dry run: nothing contacted)")
        for j in P.plan(arts, device, opts, steps, ledger):
            where = f" on {j.device!r}" if j.device != "-" else ""
            console.print(f"  {j.kind:9s} {j.artifact}{where} options={j.options!r}: {j.what} "
                          f"[{'ledger has ' + j.found if j.found else 'new'}]", highlight=False, soft_wrap=True, markup=False)
        return EXIT_OK

    err = Console(stderr=True)
    session = HubSession(args.connect_timeout)  # exit 6 before any work without a token
    session.check_device(device.hub_name)       # exit 6, bounded, before anything is built or uploaded
    bundle, comps = P.load_components(recipe, store)
    results = []
    for a in arts:
        comp = comps[a.component]
        P.check_same_build(a, bundle, comp)
        results.append(J.run_on_device(session, store, ledger, recipe, a, device, comp, opts, steps, err))
    report = J.write_report(store, recipe.name, results)

    t = Table(title=f"on-device parity on {device.hub_name} (AI Hub)")
    for col in ("artifact", "status", "latency ms", "peak mem MiB", "min SNR dB", "top-1", "steps"):
        t.add_column(col)
    for r in results:
        prof, par = r.section.get("profile") or {}, (r.section.get("parity") or {}).get("metrics") or {}
        mem, lat = prof.get("peak_memory_bytes"), prof.get("latency_ms")
        snr = min((o["snr_db"] for o in (par.get("outputs") or {}).values()), default=None)
        t.add_row(r.artifact, r.status.upper(), f"{lat:.3f}" if lat is not None else "-",
                  f"{mem / 2**20:.1f}" if mem else "-", f"{snr:.1f}" if snr is not None else "-",
                  str((par.get("lm") or {}).get("top1_agreement", "-")), str(par.get("steps", "-")))
    console.print(t)
    for r in results:
        console.print(f"  {r.status.upper():10s} {r.artifact} -> {r.location}")
        for reason in r.reasons:
            console.print(f"    {reason}", highlight=False)
        for kind, url in r.section["service_job_urls"].items():
            console.print(f"    {kind:9s} {url}", highlight=False)
    console.print(f"report: {report}")
    return EXIT_BLOCKED if any(r.status == "blocked" for r in results) else EXIT_OK


def cmd_devices(args: argparse.Namespace, console: Console) -> int:
    from .client import HubSession

    for d in HubSession(args.connect_timeout).devices():
        chip = next((a.split(":", 1)[1] for a in d.attributes if a.startswith("chipset:")), "")
        console.print(f"{d.name:40s} {d.os:8s} {chip}", highlight=False)
    return EXIT_OK
