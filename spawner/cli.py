"""The ``quota-spawner`` command: validate a quota table, show what a user gets."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from spawner import __version__
from spawner.homes.detect import CHOICES as HOME_MECHANISMS
from spawner.host.admission import CPU_RATIO, MEMORY_RATIO, HostCapacity
from spawner.host.disk import DISK_RATIO
from spawner.host.fit import describe_fit, never_fit
from spawner.quota.form import describe_limits
from spawner.quota.loader import load_quota_table, table_duration
from spawner.quota.model import Budget, GpuCapacity, QuotaTable, QuotaTableError, Role
from spawner.quota.units import format_size, hours_text, parse_size


def role_summary(role: Role, table: QuotaTable) -> dict[str, Any]:
    return {
        "name": role.name,
        "description": role.description,
        "cpus": role.cpus,
        "memory": role.memory,
        "memory_human": format_size(role.memory),
        "shm": role.shm,
        "disk": role.disk,  # the home's size; null: no limit (docs/disk.md)
        "disk_human": format_size(role.disk) if role.disk else None,
        "pids": role.pids,
        "gpus": role.gpus,
        "gpu_mode": role.gpu_mode if role.gpus else None,
        "gpu_share": role.gpu_share if role.gpu_mode == "shared" else None,
        "gpu_memory": role.gpu_memory,
        "idle_timeout": role.idle_timeout,
        "max_age": role.max_age,
        # priority, preemptible and queue_timeout hold for any role; the rest only act
        # on GPU roles, so a CPU-only role has null for them, as for its other GPU fields.
        "priority": role.priority,
        "preempts": ("lower" if role.may_preempt else "never") if role.gpus else None,
        "preemptible": role.preemptible,
        "grace_period": role.grace_period if role.gpus else None,
        "min_runtime": role.min_runtime if role.gpus else None,
        "reclaim_after": role.reclaim_after if role.gpus else None,
        "queue_timeout": role.queue_timeout,  # any start may wait for room on the host
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


def describe_budget(budget: Budget, zone: str) -> str:
    """One line on a GPU-hour budget (docs/usage.md#gpu-hour-budgets): 'group cs101: 200
    GPU-hours per month (from midnight UTC on the 1st), shared by the group · warned at
    90% · running servers keep running when it is spent'."""
    starts = {"day": "", "week": " on Mondays", "month": " on the 1st"}[budget.per]
    # hours_text, as the refusal says it: 0.005 stays 0.005, 1,000,000 is not 1e+06
    parts = [f"{budget.kind} {budget.name}: {hours_text(budget.gpu_hours)} GPU-hours "
             f"per {budget.per} (from midnight {zone}{starts})"
             + (", shared by the group" if budget.kind == "group" else "")]
    parts.append(f"warned at {budget.warn_at * 100:g}%")
    parts.append("GPU servers stopped when it is spent" if budget.stop
                 else "running servers keep running when it is spent")
    return " · ".join(parts)


def cmd_validate(args: argparse.Namespace) -> int:
    status = 0
    gpus = GpuCapacity(args.gpus, args.gpu_memory) if args.gpus is not None else None
    host = None
    if args.engine or args.host_cpus is not None or args.host_memory is not None:
        host = _host_capacity(args)
        if isinstance(host, str):
            print(f"quota-spawner validate: {host}", file=sys.stderr)
            return 2
    homes = _homes(args) if args.engine else None
    if homes is not None:
        print(homes.sentence)  # what the hub's log says at its start
        if homes.homes is None:
            status = 1
    for path in args.files:
        try:
            table = load_quota_table(path, gpus)
        except QuotaTableError as e:
            for problem in e.problems:
                print(problem)
            status = 1
        else:
            # a role that can never start on the host is a problem, as the editor says
            problems = never_fit(table, host) if host is not None else []
            problems += _homes_never_fit(path, table, homes)
            for problem in problems:
                print(problem)
            if problems:
                status = 1
            else:
                print(f"{path}: OK ({len(table.images)} images, {len(table.roles)} roles)")
            if host is not None:
                for line in describe_fit(table, host):
                    print(line)
    return status


def _host_capacity(args: argparse.Namespace) -> HostCapacity | str:
    """The host the roles are counted against: the engine's (``--engine``), lowered by
    ``--host-cpus``/``--host-memory``, or those two alone; a sentence when it cannot be."""
    settings: dict[str, Any] = {"reserve_cpus": args.reserve_cpus,
                                "reserve_memory": args.reserve_memory,
                                "cpu_ratio": args.cpu_ratio, "memory_ratio": args.memory_ratio}
    try:
        if args.engine:
            import docker

            try:
                info = docker.from_env().info()
            except Exception as e:
                return f"cannot read the Docker engine's size (DOCKER_HOST): {e}"
            return HostCapacity.from_engine(info, args.host_cpus, args.host_memory, **settings)
        if args.host_cpus is None or args.host_memory is None:
            return "without --engine, give both --host-cpus and --host-memory"
        return HostCapacity(args.host_cpus, args.host_memory, **settings)
    except ValueError as e:
        return str(e)


def _homes(args: argparse.Namespace) -> Any:
    """The homes as a hub with these settings opens them (docker/hub_homes.py)."""
    from spawner.docker.hub_homes import open_hub_homes

    return open_hub_homes(args.home_root, args.home_mechanism, args.home_image_dir,
                          args.disk_ratio, args.disk_reserve)


def _homes_never_fit(path: str, table: QuotaTable, homes: Any) -> list[str]:
    """Each role whose home is larger than the homes' filesystem may ever promise."""
    if homes is None or homes.capacity is None:
        return []
    share = homes.capacity.share
    return [f"{path}: role {role.name!r}: its home of {format_size(role.disk)} is more than "
            f"the homes' filesystem may promise all homes ({format_size(share)}), so it can "
            "never start here" for role in table.roles.values()
            if role.disk is not None and role.disk > share]


def _table_or_problems(path: str) -> QuotaTable | None:
    """The table at ``path``, or None with each of its problems printed to stderr."""
    try:
        return load_quota_table(path)
    except QuotaTableError as e:
        for problem in e.problems:
            print(problem, file=sys.stderr)
        return None


def cmd_show(args: argparse.Namespace) -> int:
    table = _table_or_problems(args.file)
    if table is None:
        return 1
    roles = table.roles_for(args.user, args.group)
    budgets = table.budgets_for(args.user, args.group)
    if args.json:
        print(json.dumps({"user": args.user, "groups": args.group,
                          "roles": [role_summary(r, table) for r in roles],
                          "budgets": [
                              {"kind": b.kind, "name": b.name, "gpu_hours": b.gpu_hours,
                               "per": b.per, "stop": b.stop, "warn_at": b.warn_at,
                               "timezone": table.budget_timezone} for b in budgets]},
                         indent=2))
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
    if budgets:
        count = f"{len(budgets)} GPU-hour budget{'s' if len(budgets) != 1 else ''}"
        print(f"{args.user} is under {count} (GPU roles only; each applies):")
        for budget in budgets:
            print(f"  {describe_budget(budget, table.budget_timezone)}")
    return 0


def count_argument(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more, not {text!r}")
    return int(text)


def number_argument(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number, 0 or more, not {text!r}")
    return value


def size_argument(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e} (sizes look like 80G or 80GiB)") from None


def _ledger_problem(url: str) -> str | None:
    """Why the ledger at ``url`` cannot be read, in one line; None when it can be opened."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception as e:
        return f"cannot read {url!r} as a database URL: {e}"
    database = parsed.database
    if (parsed.get_backend_name() == "sqlite" and database and database != ":memory:"
            and not Path(database).exists()):
        return (f"no usage ledger at {database}: the hub creates it when it starts "
                "(or run: quota-spawner ledger upgrade)")
    return None


def _open_ledger(url: str) -> Any:
    """The ledger, ready to read; LedgerNotReady or a database error otherwise."""
    from spawner.usage.ledger import Ledger, LedgerNotReady

    problem = _ledger_problem(url)
    if problem:
        raise LedgerNotReady(problem)
    return Ledger(url, create=False)


def cmd_report(args: argparse.Namespace) -> int:
    import time

    from sqlalchemy.exc import SQLAlchemyError

    from spawner.usage.ledger import LedgerNotReady, default_url
    from spawner.usage.report import build_report, format_report, month_start, parse_time

    now = time.time()
    try:
        until = parse_time(args.until, now) if args.until else now
        since = parse_time(args.since, now) if args.since else month_start(until - 1)
    except ValueError as e:
        print(f"quota-spawner report: {e}", file=sys.stderr)
        return 2
    if since >= until:
        print("quota-spawner report: --since must be before --until", file=sys.stderr)
        return 2
    table = None
    if args.quota_file:
        table = _table_or_problems(args.quota_file)
        if table is None:
            return 1
    try:
        ledger = _open_ledger(args.db or default_url())
        try:
            report = build_report(ledger.engine, since=since, until=until, by=args.by,
                                  table=table, group=args.group, now=now)
        finally:
            ledger.dispose()
    except (LedgerNotReady, SQLAlchemyError, ImportError) as e:
        print(f"quota-spawner report: {_one_line(e)}", file=sys.stderr)
        return 2
    sys.stdout.write(format_report(report, args.format))
    if table is not None and not report.advice and args.format == "table":
        print("\nRight-sizing advice: none for this window; it needs sessions with samples "
              "from the watchdog.")
    return 0


def _one_line(error: Exception) -> str:
    from sqlalchemy.exc import SQLAlchemyError

    if isinstance(error, ImportError):
        return f"the database's driver is missing: {error}"
    if isinstance(error, SQLAlchemyError) and getattr(error, "orig", None) is not None:
        return f"the usage ledger could not be read: {error.orig}"  # type: ignore[attr-defined]
    return str(error).splitlines()[0]


def cmd_ledger_upgrade(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from spawner.usage.ledger import Ledger, current_revision, default_url

    try:
        ledger = Ledger(args.db or default_url())
        try:
            with ledger.engine.connect() as connection:
                revision = current_revision(connection)
        finally:
            ledger.dispose()
    except (SQLAlchemyError, ImportError) as e:
        print(f"quota-spawner ledger: {_one_line(e)}", file=sys.stderr)
        return 2
    print(f"Usage ledger at {ledger.url_text} is at revision {revision}.")
    return 0


def cmd_ledger_status(args: argparse.Namespace) -> int:
    from sqlalchemy import func, inspect, select
    from sqlalchemy.exc import SQLAlchemyError

    from spawner.usage.ledger import current_revision, default_url, head_revision, make_engine
    from spawner.usage.schema import sessions

    url = args.db or default_url()
    problem = _ledger_problem(url)
    if problem:
        print(f"quota-spawner ledger: {problem}", file=sys.stderr)
        return 2
    try:
        engine = make_engine(url, create=False)  # only reads: WAL is the owner's to set
    except (SQLAlchemyError, ImportError) as e:
        print(f"quota-spawner ledger: {_one_line(e)}", file=sys.stderr)
        return 2
    try:
        with engine.connect() as connection:
            revision = current_revision(connection)
            counts = None
            if inspect(connection).has_table(sessions.name):
                counts = connection.execute(select(
                    func.count(), func.count(sessions.c.id).filter(
                        sessions.c.stopped.is_(None)))).one()
    except SQLAlchemyError as e:
        print(f"quota-spawner ledger: {_one_line(e)}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    head = head_revision()
    state = ("up to date" if revision == head else
             f"needs an upgrade to {head} (run: quota-spawner ledger upgrade)")
    print(f"URL:      {engine.url.render_as_string(hide_password=True)}")
    print(f"Revision: {revision or 'none'} ({state})")
    if counts is None:
        print("Sessions: no sessions table")
    else:
        print(f"Sessions: {counts[0]} ({counts[1]} open)")
    return 0 if revision == head else 1


def cmd_k8s_priority_classes(args: argparse.Namespace) -> int:
    from spawner.kube.priority import manifests_yaml, preemption_notes

    table = _table_or_problems(args.file)
    if table is None:
        return 1
    # stdout goes to kubectl; the notes are in the YAML's comments and on stderr
    sys.stdout.write(manifests_yaml(table, args.prefix, args.namespace))
    for note in preemption_notes(table):
        print(f"quota-spawner k8s: note: {note}", file=sys.stderr)
    return 0


def class_prefix_argument(text: str) -> str:
    from spawner.kube.priority import check_prefix

    try:
        return check_prefix(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quota-spawner", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="check quota tables; print FILE:LINE: problems")
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.add_argument("--gpus", type=count_argument, metavar="N",
                          help="also check the roles against a hub with N GPUs")
    validate.add_argument("--gpu-memory", metavar="SIZE", type=size_argument,
                          help="with --gpus: the smallest GPU's memory, like 80G")
    validate.add_argument("--engine", action="store_true",
                          help="also say how many servers of each role fit on the Docker "
                               "engine's host (DOCKER_HOST), after the reserve; a role "
                               "none of fit is a problem")
    validate.add_argument("--host-cpus", type=number_argument, metavar="N",
                          help="count fewer CPUs than the engine has (without --engine: the "
                               "host's CPUs)")
    validate.add_argument("--host-memory", type=size_argument, metavar="SIZE",
                          help="count less memory than the engine has (without --engine: "
                               "the host's memory)")
    validate.add_argument("--reserve-cpus", type=number_argument, metavar="N",
                          help="CPUs kept for the hub, proxy and system (a tenth of the "
                               "host's, at most 1)")
    validate.add_argument("--reserve-memory", type=size_argument, metavar="SIZE",
                          help="memory kept for the hub, proxy and system (a tenth of the "
                               "host's, at least 1G)")
    validate.add_argument("--home-root", metavar="DIR",
                          default=os.environ.get("QUOTA_SPAWNER_HOME_ROOT", ""),
                          help="with --engine: the hub's home_root ($QUOTA_SPAWNER_HOME_ROOT); "
                               "say how the homes are kept, as the hub's log does")
    validate.add_argument("--home-mechanism", metavar="NAME", choices=HOME_MECHANISMS,
                          default=os.environ.get("QUOTA_SPAWNER_HOME_MECHANISM", "auto"),
                          help="the hub's home_mechanism ($QUOTA_SPAWNER_HOME_MECHANISM; "
                               f"{', '.join(HOME_MECHANISMS)})")
    validate.add_argument("--home-image-dir", metavar="DIR",
                          default=os.environ.get("QUOTA_SPAWNER_HOME_IMAGE_DIR", ""),
                          help="the hub's home_image_dir ($QUOTA_SPAWNER_HOME_IMAGE_DIR)")
    validate.add_argument("--disk-ratio", type=number_argument, metavar="R",
                          default=os.environ.get("QUOTA_SPAWNER_DISK_RATIO", DISK_RATIO),
                          help="the homes' overcommit ($QUOTA_SPAWNER_DISK_RATIO; "
                               f"{DISK_RATIO:g})")
    validate.add_argument("--disk-reserve", metavar="SIZE",
                          default=os.environ.get("QUOTA_SPAWNER_DISK_RESERVE", ""),
                          help="room kept free on the homes' filesystem "
                               "($QUOTA_SPAWNER_DISK_RESERVE; a tenth, at most 100G)")
    validate.add_argument("--cpu-ratio", type=number_argument, metavar="R", default=CPU_RATIO,
                          help=f"CPU overcommit ({CPU_RATIO:g})")
    validate.add_argument("--memory-ratio", type=number_argument, metavar="R",
                          default=MEMORY_RATIO, help=f"memory overcommit ({MEMORY_RATIO:g})")
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
    from spawner.usage.report import BY, FORMATS

    report = sub.add_parser(
        "report", help="GPU, CPU and memory hours reserved and used, how sessions ended, "
                       "and right-sizing advice, from the usage ledger (docs/usage.md)")
    report.add_argument("--db", metavar="URL", default=None,
                        help="the ledger's SQLAlchemy URL (default: $QUOTA_SPAWNER_USAGE_DB, "
                             "else quota-spawner-usage.sqlite in $QUOTA_SPAWNER_STATE_DIR or "
                             "here)")
    report.add_argument("--quota-file", metavar="FILE",
                        help="the quota table: adds right-sizing advice per user and role")
    report.add_argument("--since", metavar="WHEN",
                        help="start: an ISO date or time (UTC unless it has an offset) or "
                             "a time back from now like 30d, 12h, 2w (default: the first "
                             "of the month --until falls in)")
    report.add_argument("--until", metavar="WHEN", help="end, not included (default: now)")
    report.add_argument("--by", choices=BY, default="user", help="one row per (default: user)")
    report.add_argument("--group", metavar="G",
                        help="only the sessions of members of group G (as recorded at start)")
    report.add_argument("--format", choices=FORMATS, default="table",
                        help="table (for people, default), csv or json")
    report.set_defaults(func=cmd_report)
    ledger = sub.add_parser("ledger", help="create, upgrade or inspect the usage ledger")
    ledger_sub = ledger.add_subparsers(dest="ledger_command", required=True)
    for name, func, text in (
            ("upgrade", cmd_ledger_upgrade,
             "create the ledger, or migrate it to this version (as jupyterhub upgrade-db)"),
            ("status", cmd_ledger_status,
             "the ledger's URL (no password), its revision and how many sessions it holds")):
        command = ledger_sub.add_parser(name, help=text)
        command.add_argument("--db", metavar="URL", default=None,
                             help="the ledger's SQLAlchemy URL (default as for report)")
        command.set_defaults(func=func)
    k8s = sub.add_parser("k8s", help="Kubernetes manifests from the quota table "
                                     "(docs/kubernetes.md)")
    k8s_sub = k8s.add_subparsers(dest="k8s_command", required=True)
    classes = k8s_sub.add_parser(
        "priority-classes",
        help="print a PriorityClass per role (and a PodDisruptionBudget for roles with "
             "preemptible: false) as YAML for kubectl apply -f -")
    classes.add_argument("file", metavar="FILE")
    classes.add_argument("--prefix", type=class_prefix_argument, default="quota-spawner-",
                         help="the start of each class's name (default: quota-spawner-)")
    classes.add_argument("--namespace", metavar="NS", default=None,
                         help="the PodDisruptionBudget's namespace (default: none written; "
                              "kubectl apply -n NS)")
    classes.set_defaults(func=cmd_k8s_priority_classes)
    return parser


def run_watchdog(argv: list[str]) -> int:
    from spawner.watchdog.app import QuotaWatchdog  # the other commands never load it

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
