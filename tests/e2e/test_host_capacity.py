"""The host's size as a real engine reports it: ``quota-spawner validate --engine``."""

from __future__ import annotations

from pathlib import Path

from spawner.cli import main as cli_main
from spawner.host.admission import HostCapacity
from spawner.host.fit import never_fit
from spawner.quota.loader import load_quota_table
from spawner.quota.units import format_human

EXAMPLE = str(Path(__file__).resolve().parents[2] / "hub_config" / "quotas.yaml")


def test_validate_counts_the_roles_against_the_engines_host(docker_client, capsys):
    """Each role's count on the engine's host; a role none of fit there is a FILE:LINE
    problem and the command exits 1 (the shipped gpu-training, 32 GiB, on a small test
    machine), else 0."""
    info = docker_client.info()
    host = HostCapacity(info["NCPU"], info["MemTotal"])
    table = load_quota_table(EXAMPLE)
    never = never_fit(table, host)
    assert cli_main(["validate", "--engine", EXAMPLE]) == (1 if never else 0)
    out = capsys.readouterr().out
    assert [str(p) for p in never] == [line for line in out.splitlines()
                                       if line.startswith(f"{EXAMPLE}:")]
    assert (f"The host: {info['NCPU']:g} CPU{'s' if info['NCPU'] != 1 else ''} and "
            f"{format_human(info['MemTotal'])};") in out
    student = table.roles["student"]
    count, limit = host.servers_that_fit(student)
    assert count > 0, "the engine should hold at least one 1-CPU, 2 GiB server"
    runs_out = "the CPUs run" if limit == "CPUs" else "the memory runs"
    assert f"  student (1 CPU, 2 GiB): {count} fit ({runs_out} out first)" in out
    # an admin's lower figure is taken (notebooks then get 2 GiB: a 4 GiB role never
    # fits), a higher one is not
    assert cli_main(["validate", "--engine", "--host-memory", "3G", EXAMPLE]) == 1
    out = capsys.readouterr().out
    assert "and 3 GiB;" in out
    assert (f"{EXAMPLE}:{table.role_lines['junior-researcher']}: role 'junior-researcher' "
            "(2 CPUs, 4 GiB): none fit on this host: one server's 4 GiB of memory is more "
            "than the notebooks' 2 GiB") in out.splitlines()
    assert "  student (1 CPU, 2 GiB): 1 fit (the memory runs out first)" in out
    assert cli_main(["validate", "--engine", "--host-memory", "64T", EXAMPLE]) == (
        1 if never else 0)
    assert f"and {format_human(info['MemTotal'])};" in capsys.readouterr().out


def test_validate_without_an_engine_says_so(monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert cli_main(["validate", "--engine", EXAMPLE]) == 2
    assert "cannot read the Docker engine's size (DOCKER_HOST)" in capsys.readouterr().err
