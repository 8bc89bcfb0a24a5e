"""The quota-spawner command."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import gpu_table, line_of
from spawner.cli import main as cli_main

G = 2**30
EXAMPLE = str(Path(__file__).resolve().parents[2] / "hub_config" / "quotas.yaml")


def run(*args):
    return subprocess.run([sys.executable, "-m", "spawner.cli", *args],
                          capture_output=True, text=True)


def test_validate_ok():
    result = run("validate", EXAMPLE)
    assert result.returncode == 0
    assert "OK" in result.stdout


def test_validate_reports_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(EXAMPLE).read_text().replace("cpus: 4", "cpus: -4", 1))
    result = run("validate", str(bad))
    assert result.returncode == 1
    line = next(i for i, t in enumerate(bad.read_text().splitlines(), 1) if "cpus: -4" in t)
    assert result.stdout.strip() == (
        f"{bad}:{line}: role 'senior-engineer': cpus must be greater than 0, not -4"
    )


def test_console_script_installed():
    bindir = Path(sys.executable).parent
    result = subprocess.run([str(bindir / "quota-spawner"), "validate", EXAMPLE],
                            capture_output=True, text=True)
    assert result.returncode == 0


def test_show_text_and_json():
    text = run("show", EXAMPLE, "--user", "bob", "--group", "ml-platform")
    assert "senior-engineer: 4 CPUs · 16 GiB memory" in text.stdout
    data = json.loads(run("show", EXAMPLE, "--user", "research-lead", "--json").stdout)
    assert [r["name"] for r in data["roles"]] == ["senior-engineer", "gpu-training"]
    assert data["roles"][0]["memory"] == 16 * 2**30
    assert data["roles"][0]["cpus"] == 4
    assert data["roles"][0]["gpus"] == 0
    gpu = data["roles"][1]
    assert (gpu["gpus"], gpu["gpu_mode"], gpu["gpu_share"]) == (1, "exclusive", None)
    lab = json.loads(run("show", EXAMPLE, "--user", "s", "--group", "cs101", "--json").stdout)
    shared = lab["roles"][1]
    assert (shared["name"], shared["gpu_mode"], shared["gpu_share"]) == ("gpu-lab", "shared", 4)
    assert shared["gpu_memory"] == 16 * 2**30


def test_validate_against_a_gpu_inventory():
    ok = run("validate", EXAMPLE, "--gpus", "1", "--gpu-memory", "80G")
    assert ok.returncode == 0, ok.stdout
    small = run("validate", EXAMPLE, "--gpus", "1", "--gpu-memory", "8G")
    assert small.returncode == 1
    assert "role 'gpu-lab': gpu_memory 16 GiB is more than the smallest GPU's memory (8 GiB)" in small.stdout
    bad_size = run("validate", EXAMPLE, "--gpus", "1", "--gpu-memory", "80GB")
    assert bad_size.returncode == 2 and "sizes look like 80G" in bad_size.stderr
    assert "Traceback" not in bad_size.stderr
    alone = run("validate", EXAMPLE, "--gpu-memory", "80G")
    assert alone.returncode == 2 and "--gpu-memory needs --gpus" in alone.stderr
    default = json.loads(run("show", EXAMPLE, "--user", "someone", "--json").stdout)
    assert [r["name"] for r in default["roles"]] == ["junior-researcher"]


def _edited(tmp_path, old, new):
    bad = tmp_path / "bad.yaml"
    text = Path(EXAMPLE).read_text()
    assert old in text
    bad.write_text(text.replace(old, new, 1))
    last = new.strip().splitlines()[-1].strip()
    line = next(i for i, t in enumerate(bad.read_text().splitlines(), 1) if last in t)
    return bad, line


def test_validate_refuses_non_finite_numbers_without_a_traceback(tmp_path):
    for old, new, message in [
        ("memory: 16G", "memory: .inf", "role 'senior-engineer': memory must be a finite size, "
                                        "not .inf"),
        ("cpus: 4", "cpus: .nan", "role 'senior-engineer': cpus must be a finite number, not .nan"),
        ("idle_timeout: 20m", "idle_timeout: .inf",
         "role 'student': idle_timeout must be a finite duration, not .inf"),
    ]:
        bad, line = _edited(tmp_path, old, new)
        result = run("validate", str(bad))
        assert result.returncode == 1
        assert result.stdout.strip() == f"{bad}:{line}: {message}"
        assert "Traceback" not in result.stdout + result.stderr


def test_show_refuses_a_user_name_yaml_reads_as_a_number(tmp_path):
    bad, line = _edited(tmp_path, "  users:\n", "  users:\n    0123: [pipeline]\n")
    result = run("show", str(bad), "--user", "83")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip() == (
        f"{bad}:{line}: the user name 0123 is read by YAML as the number 83; "
        "write it in quotes: '0123'"
    )
    quoted = tmp_path / "quoted.yaml"
    quoted.write_text(bad.read_text().replace("0123:", "'0123':"))
    data = json.loads(run("show", str(quoted), "--user", "0123", "--json").stdout)
    assert [r["name"] for r in data["roles"]] == ["pipeline"]


# --- GPU fields, through main() ---------------------------------------------------


def cli(capsys, *args: str) -> tuple[int, str]:
    code = cli_main(list(args))
    return code, capsys.readouterr().out


def test_cli_validate_against_a_gpu_count(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    text = gpu_table("gpus: 2")
    path.write_text(text)
    code, out = cli(capsys, "validate", str(path), "--gpus", "1")
    assert code == 1
    assert out.strip() == f"{path}:{line_of(text, 'gpus: 2')}: role 'r': gpus is 2, but this hub has only 1 GPU"
    assert cli(capsys, "validate", str(path))[0] == 0  # no inventory given: not checked
    assert cli(capsys, "validate", str(path), "--gpus", "2")[0] == 0


def test_cli_validate_gpu_memory(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    text = gpu_table("gpus: 1\ngpu_mode: shared\ngpu_share: 4\ngpu_memory: 48G")
    path.write_text(text)
    code, out = cli(capsys, "validate", str(path), "--gpus", "1", "--gpu-memory", "40G")
    assert code == 1
    assert out.strip() == (f"{path}:{line_of(text, 'gpu_memory')}: role 'r': gpu_memory 48 GiB "
                           "is more than the smallest GPU's memory (40 GiB)")
    assert cli(capsys, "validate", str(path), "--gpus", "1", "--gpu-memory", "80G")[0] == 0
    with pytest.raises(SystemExit) as info:
        cli_main(["validate", str(path), "--gpus", "1", "--gpu-memory", "lots"])
    assert info.value.code == 2
    assert "cannot read 'lots' as a size" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli_main(["validate", str(path), "--gpu-memory", "40G"])
    assert info.value.code == 2
    assert "--gpu-memory needs --gpus" in capsys.readouterr().err


def test_cli_validate_subprocess_exit_code(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text(gpu_table("gpus: 2"))
    result = subprocess.run([sys.executable, "-m", "spawner.cli", "validate", str(path),
                             "--gpus", "1"], capture_output=True, text=True)
    assert result.returncode == 1
    assert "gpus is 2, but this hub has only 1 GPU" in result.stdout


def test_cli_show_prints_gpus(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    path.write_text(gpu_table("gpus: 1\ngpu_mode: shared\ngpu_share: 3\ngpu_memory: 16G"))
    code, out = cli(capsys, "show", str(path), "--user", "bob")
    assert code == 0
    assert "  cpu: 1 CPU · 1 GiB memory; images: pytorch" in out
    assert "  r: 1 CPU · 1 GiB memory · 1 GPU, shared by up to 3 · 16 GiB GPU memory cap" in out
    code, out = cli(capsys, "show", str(path), "--user", "bob", "--json")
    roles = {r["name"]: r for r in json.loads(out)["roles"]}
    assert {k: roles["r"][k] for k in ("gpus", "gpu_mode", "gpu_share", "gpu_memory")} == {
        "gpus": 1, "gpu_mode": "shared", "gpu_share": 3, "gpu_memory": 16 * G}
    assert {k: roles["cpu"][k] for k in ("gpus", "gpu_mode", "gpu_share", "gpu_memory")} == {
        "gpus": 0, "gpu_mode": None, "gpu_share": None, "gpu_memory": None}


def test_cli_show_example_gpu_role(capsys):
    code, out = cli(capsys, "show", str(EXAMPLE), "--user", "research-lead")
    assert code == 0
    assert re.search(r"gpu-training: .* · \d+ GPUs?, exclusive", out)


# --- how many servers fit on a host ------------------------------------------------


def test_cli_validate_says_how_many_servers_of_each_role_fit(capsys):
    code, out = cli(capsys, "validate", EXAMPLE, "--host-cpus", "32", "--host-memory", "256G")
    assert code == 0
    assert ("The host: 32 CPUs and 256 GiB; 1 CPU and 25.6 GiB kept back for the hub, the "
            "proxy and the system; notebooks may reserve 124 CPUs (4x) and 230 GiB (1x).") in out
    assert "  junior-researcher (2 CPUs, 4 GiB): 57 fit (the memory runs out first)" in out
    code, out = cli(capsys, "validate", EXAMPLE, "--host-cpus", "2", "--host-memory", "16G",
                    "--reserve-cpus", "0", "--reserve-memory", "0", "--cpu-ratio", "1")
    assert "  junior-researcher (2 CPUs, 4 GiB): 1 fit (the CPUs run out first)" in out
    assert ("  gpu-training (8 CPUs, 32 GiB): none fit: one server's 32 GiB of memory is "
            "more than the notebooks' 16 GiB") in out


def test_cli_validate_a_role_that_can_never_start_on_the_host_is_a_problem(capsys):
    """A role larger than the notebooks' share of the host is a FILE:LINE problem and the
    command exits 1, as for --gpus (the table editor refuses it with the same words); the
    other roles' counts are still printed."""
    code, out = cli(capsys, "validate", EXAMPLE, "--host-cpus", "2", "--host-memory", "23.5G")
    text = Path(EXAMPLE).read_text()
    problems = [line for line in out.splitlines() if not line.startswith("  ")]
    assert (code, problems) == (1, [
        f"{EXAMPLE}:{line_of(text, '  gpu-training:')}: role 'gpu-training' (8 CPUs, 32 GiB): "
        "none fit on this host: one server's 32 GiB of memory is more than the notebooks' "
        "21.2 GiB"])
    assert "  senior-engineer (4 CPUs, 16 GiB): 1 fit (the memory runs out first)" in out
    assert "  gpu-training (8 CPUs, 32 GiB): none fit: one server's 32 GiB" in out
    code, out = cli(capsys, "validate", EXAMPLE, "--host-cpus", "8", "--host-memory", "64G")
    assert code == 0 and f"{EXAMPLE}: OK (2 images, 7 roles)" in out


@pytest.mark.parametrize("args, words", [
    (("--host-cpus", "4"), "give both --host-cpus and --host-memory"),
    (("--host-cpus", "4", "--host-memory", "8G", "--cpu-ratio", "0.5"), "at least 1"),
])
def test_cli_validate_host_settings_that_cannot_be_used(capsys, args, words):
    assert cli_main(["validate", EXAMPLE, *args]) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "-1", "inf", "lots"])
def test_cli_validate_odd_host_numbers_are_usage_errors(capsys, value):
    with pytest.raises(SystemExit) as e:
        cli_main(["validate", EXAMPLE, "--host-cpus", value, "--host-memory", "8G"])
    assert e.value.code == 2
    assert "expected a number, 0 or more" in capsys.readouterr().err


def test_the_version_is_written_once_and_printed():
    """spawner/__init__.py's __version__ is the release (semantic versioning): the installed
    distribution's and ``quota-spawner --version``'s; pyproject.toml reads it from there."""
    import importlib.metadata

    import tomllib

    import spawner

    assert re.fullmatch(r"\d+\.\d+\.\d+", spawner.__version__)
    assert importlib.metadata.version("quota-spawner") == spawner.__version__
    result = subprocess.run([str(Path(sys.executable).parent / "quota-spawner"), "--version"],
                            capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (0, f"quota-spawner {spawner.__version__}\n")
    pyproject = tomllib.loads((Path(EXAMPLE).parents[1] / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "spawner.__version__"}


# --- the homes, with --engine -------------------------------------------------------


def test_cli_validate_engine_says_how_the_homes_are_kept(capsys, tmp_path, monkeypatch):
    """The hub's start sentence about the homes, from the same settings: a homes' root on a
    filesystem without quotas is not enforced (and says why), a mechanism that cannot work
    here is a problem (every start of a role with disk would be refused)."""
    import docker

    engine = type("Engine", (), {"info": lambda self: {"NCPU": 8, "MemTotal": 64 * 2**30}})
    monkeypatch.setattr(docker, "from_env", lambda: engine())
    monkeypatch.delenv("QUOTA_SPAWNER_HOME_ROOT", raising=False)
    code, out = cli(capsys, "validate", EXAMPLE, "--engine")
    assert code == 0 and out.splitlines()[0] == (
        "Disk is not enforced: no homes' root is set, so homes are Docker volumes, which "
        "have no size; see docs/disk.md")
    monkeypatch.setenv("QUOTA_SPAWNER_HOME_ROOT", str(tmp_path))  # as the shipped config
    code, out = cli(capsys, "validate", EXAMPLE, "--engine", "--home-mechanism", "btrfs")
    assert code == 1 and out.splitlines()[0].startswith(
        f"Disk is not enforced: {tmp_path} is on ")
    assert "every start of a role with disk is refused" in out.splitlines()[0]
