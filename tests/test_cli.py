"""The quota-spawner command."""

import json
import subprocess
import sys
from pathlib import Path

EXAMPLE = str(Path(__file__).resolve().parent.parent / "hub_config" / "quotas.yaml")


def run(*args):
    return subprocess.run([sys.executable, "-m", "spawner.cli", *args],
                          capture_output=True, text=True)


def test_validate_ok():
    result = run("validate", EXAMPLE)
    assert result.returncode == 0
    assert "OK" in result.stdout


def test_validate_reports_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(EXAMPLE).read_text().replace("cpus: 8", "cpus: -8"))
    result = run("validate", str(bad))
    assert result.returncode == 1
    line = next(i for i, t in enumerate(bad.read_text().splitlines(), 1) if "cpus: -8" in t)
    assert result.stdout.strip() == (
        f"{bad}:{line}: role 'senior-engineer': cpus must be greater than 0, not -8"
    )


def test_console_script_installed():
    bindir = Path(sys.executable).parent
    result = subprocess.run([str(bindir / "quota-spawner"), "validate", EXAMPLE],
                            capture_output=True, text=True)
    assert result.returncode == 0


def test_show_text_and_json():
    text = run("show", EXAMPLE, "--user", "bob", "--group", "ml-platform")
    assert "senior-engineer: 8 CPUs · 32 GiB memory" in text.stdout
    data = json.loads(run("show", EXAMPLE, "--user", "research-lead", "--json").stdout)
    assert [r["name"] for r in data["roles"]] == ["senior-engineer"]
    assert data["roles"][0]["memory"] == 32 * 2**30
    assert data["roles"][0]["cpus"] == 8
    default = json.loads(run("show", EXAMPLE, "--user", "someone", "--json").stdout)
    assert [r["name"] for r in default["roles"]] == ["junior-researcher"]
