"""The host's size as a real engine reports it: ``quota-spawner validate --engine``."""

from __future__ import annotations

from pathlib import Path

from spawner.cli import main as cli_main
from spawner.host.admission import HostCapacity
from spawner.quota.loader import load_quota_table
from spawner.quota.units import format_human

EXAMPLE = str(Path(__file__).resolve().parents[2] / "hub_config" / "quotas.yaml")


def test_validate_counts_the_roles_against_the_engines_host(docker_client, capsys):
    info = docker_client.info()
    assert cli_main(["validate", "--engine", EXAMPLE]) == 0
    out = capsys.readouterr().out
    host = HostCapacity(info["NCPU"], info["MemTotal"])
    assert (f"The host: {info['NCPU']:g} CPU{'s' if info['NCPU'] != 1 else ''} and "
            f"{format_human(info['MemTotal'])};") in out
    student = load_quota_table(EXAMPLE).roles["student"]
    count, limit = host.servers_that_fit(student)
    assert count > 0, "the engine should hold at least one 1-CPU, 2 GiB server"
    runs_out = "the CPUs run" if limit == "CPUs" else "the memory runs"
    assert f"  student (1 CPU, 2 GiB): {count} fit ({runs_out} out first)" in out
    # an admin's lower figure is taken, a higher one is not
    assert cli_main(["validate", "--engine", "--host-memory", "4G", EXAMPLE]) == 0
    assert "and 4 GiB;" in capsys.readouterr().out
    assert cli_main(["validate", "--engine", "--host-memory", "64T", EXAMPLE]) == 0
    assert f"and {format_human(info['MemTotal'])};" in capsys.readouterr().out


def test_validate_without_an_engine_says_so(monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert cli_main(["validate", "--engine", EXAMPLE]) == 2
    assert "cannot read the Docker engine's size (DOCKER_HOST)" in capsys.readouterr().err
