"""The ``quota-spawner`` command: validate a quota table, show what a user gets."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .quota.form import describe_limits
from .quota.loader import load_quota_table, table_duration
from .quota.model import GpuCapacity, QuotaTable, QuotaTableError, Role
from .quota.units import format_size, parse_size


def role_summary(role: Role, table: QuotaTable) -> dict[str, Any]:
    return {
        "name": role.name,
        "description": role.description,
        "cpus": role.cpus,
        "memory": role.memory,
        "memory_human": format_size(role.memory),
        "shm": role.shm,
        "pids": role.pids,
        "gpus": role.gpus,
        "gpu_mode": role.gpu_mode if role.gpus else None,
        "gpu_share": role.gpu_share if role.gpu_mode == "shared" else None,
        "gpu_memory": role.gpu_memory,
        "idle_timeout": role.idle_timeout,
        "max_age": role.max_age,
        # priority and preemptible hold for any role; the rest only act on GPU roles,
        # so a CPU-only role has null for them, as for its other GPU fields.
        "priority": role.priority,
        "preempts": ("lower" if role.may_preempt else "never") if role.gpus else None,
        "preemptible": role.preemptible,
        "grace_period": role.grace_period if role.gpus else None,
        "min_runtime": role.min_runtime if role.gpus else None,
        "reclaim_after": role.reclaim_after if role.gpus else None,
        "queue_timeout": role.queue_timeout if role.gpus else None,
        "images": [
            {"key": key, "image": table.images[key].image,
             "display_name": table.images[key].display_name}
            for key in role.images
        ],
    }


def describe_preemption(role: Role) -> str:
    """One line on what a GPU role does when GPUs are short (docs/preemption.md):
    'priority 500000 · preempts lower priorities · preemptible after 10m running,
    with 2m to save · waits up to 10m for a GPU'."""
    parts = [f"priority {role.priority}",
             "preempts lower priorities" if role.may_preempt else "never preempts"]
    grace = (f"with {table_duration(role.grace_period)} to save" if role.grace_period
             else "stopped at once")
    if role.preemptible:
        when = (f"after {table_duration(role.min_runtime)} running" if role.min_runtime
                else "at any age")
        parts.append(f"preemptible {when}, {grace}")
    elif role.reclaim_after is not None:
        # min_runtime shields every server too, so the later of the two counts
        until = max(role.reclaim_after, role.min_runtime)
        parts.append(f"protected for {table_duration(until)}, then preemptible {grace}")
    else:
        parts.append("not preemptible")
    parts.append(f"waits up to {table_duration(role.queue_timeout)} for a GPU"
                 if role.queue_timeout else "no queue: refused when no GPU is free")
    return " · ".join(parts)


def cmd_validate(args: argparse.Namespace) -> int:
    status = 0
    gpus = GpuCapacity(args.gpus, args.gpu_memory) if args.gpus is not None else None
    for path in args.files:
        try:
            table = load_quota_table(path, gpus)
        except QuotaTableError as e:
            for problem in e.problems:
                print(problem)
            status = 1
        else:
            print(f"{path}: OK ({len(table.images)} images, {len(table.roles)} roles)")
    return status


def cmd_show(args: argparse.Namespace) -> int:
    try:
        table = load_quota_table(args.file)
    except QuotaTableError as e:
        for problem in e.problems:
            print(problem, file=sys.stderr)
        return 1
    roles = table.roles_for(args.user, args.group)
    if args.json:
        print(json.dumps({"user": args.user, "groups": args.group,
                          "roles": [role_summary(r, table) for r in roles]}, indent=2))
        return 0
    if not roles:
        print(f"{args.user} holds no role and cannot start a server.")
        return 0
    print(f"{args.user} holds {len(roles)} role{'s' if len(roles) != 1 else ''}:")
    for role in roles:
        images = ", ".join(table.images[k].display_name for k in role.images)
        extras = [f"pids {role.pids}"] if role.pids else []
        if role.idle_timeout:
            extras.append(f"idle timeout {role.idle_timeout:g}s")
        if role.max_age:
            extras.append(f"max age {role.max_age:g}s")
        extra = "".join(f", {e}" for e in extras)
        print(f"  {role.name}: {describe_limits(role)}{extra}; images: {images}")
        if role.gpus:  # preemption and the queue only act on GPU roles
            print(f"    {describe_preemption(role)}")
    return 0


def count_argument(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more, not {text!r}")
    return int(text)


def size_argument(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e} (sizes look like 80G or 80GiB)") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quota-spawner", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="check quota tables; print FILE:LINE: problems")
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.add_argument("--gpus", type=count_argument, metavar="N",
                          help="also check the roles against a hub with N GPUs")
    validate.add_argument("--gpu-memory", metavar="SIZE", type=size_argument,
                          help="with --gpus: the smallest GPU's memory, like 80G")
    validate.set_defaults(func=cmd_validate)
    show = sub.add_parser("show", help="show the roles a user would get, with their limits")
    show.add_argument("file", metavar="FILE")
    show.add_argument("--user", required=True, metavar="NAME")
    show.add_argument("--group", action="append", default=[], metavar="G",
                      help="a JupyterHub group the user is in (repeatable)")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=cmd_show)
    watchdog = sub.add_parser(
        "watchdog", add_help=False,
        help="run the GPU and memory watchdog beside the hub (docs/watchdog.md); "
             "'quota-spawner watchdog --help-all' lists its settings")
    watchdog.set_defaults(func=None)  # main() hands its arguments to the watchdog app
    return parser


def run_watchdog(argv: list[str]) -> int:
    from .watchdog.app import QuotaWatchdog  # the other commands never load it

    QuotaWatchdog.launch_instance(argv)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["watchdog"]:  # its settings are traitlets', not argparse's
        return run_watchdog(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "gpu_memory", None) is not None and args.gpus is None:
        parser.error("--gpu-memory needs --gpus")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
