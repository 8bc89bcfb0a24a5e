"""Finish a build of the JupyterLab extension and stamp it with its sources.

``make labextension`` runs this after ``jupyter labextension build``, which
empties ``spawner/labextension/`` and writes the build there. This script
copies ``install.json`` next to the build and writes
``spawner/labextension/build-stamp.json``: the sha256 of every source file and
of the sources together, and the sha256 of every file of the build.
``tests/unit/test_labextension.py`` recomputes the sources' digest, so a change to
the sources without a rebuild fails the tests.

    python labextension/stamp.py           # copy install.json, write the stamp
    python labextension/stamp.py --check   # exit 1 if the stamp is stale
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

SOURCE_DIR = Path(__file__).resolve().parent
BUILD_DIR = SOURCE_DIR.parent / "spawner" / "labextension"
STAMP_NAME = "build-stamp.json"

# What the build is made from. lib/ is tsc's output from src/, node_modules/
# is pinned by package-lock.json.
SOURCE_FILES = ("package.json", "package-lock.json", "tsconfig.json", "webpack.config.js",
                "install.json")
SOURCE_GLOBS = ("src/**/*", "style/**/*")


def file_sha256(path: Path) -> str:
    """sha256 of a file, with CRLF read as LF (a Windows checkout hashes the same)."""
    return hashlib.sha256(path.read_bytes().replace(b"\r\n", b"\n")).hexdigest()


def source_files(source_dir: Path = SOURCE_DIR) -> list[Path]:
    """Every source file, sorted by its path relative to ``source_dir``."""
    found = {source_dir / name for name in SOURCE_FILES}
    for pattern in SOURCE_GLOBS:
        found.update(p for p in source_dir.glob(pattern) if p.is_file())
    return sorted(found, key=lambda p: p.relative_to(source_dir).as_posix())


def source_hashes(source_dir: Path = SOURCE_DIR) -> dict[str, str]:
    return {p.relative_to(source_dir).as_posix(): file_sha256(p)
            for p in source_files(source_dir)}


def sources_digest(hashes: dict[str, str]) -> str:
    """One sha256 over the sorted (path, sha256) pairs."""
    text = "".join(f"{path}\0{digest}\n" for path, digest in sorted(hashes.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def build_hashes(build_dir: Path = BUILD_DIR) -> dict[str, str]:
    """Every file of the build but the stamp itself."""
    return {p.relative_to(build_dir).as_posix(): file_sha256(p)
            for p in sorted(build_dir.rglob("*"))
            if p.is_file() and p.relative_to(build_dir).as_posix() != STAMP_NAME}


def make_stamp(source_dir: Path = SOURCE_DIR, build_dir: Path = BUILD_DIR) -> dict[str, Any]:
    package = json.loads((source_dir / "package.json").read_text(encoding="utf-8"))
    hashes = source_hashes(source_dir)
    return {
        "package": package["name"],
        "version": package["version"],
        "sources_sha256": sources_digest(hashes),
        "sources": hashes,
        "build": build_hashes(build_dir),
        "rebuild": "make labextension",
    }


def read_stamp(build_dir: Path = BUILD_DIR) -> dict[str, Any]:
    return json.loads((build_dir / STAMP_NAME).read_text(encoding="utf-8"))


def stale_reasons(source_dir: Path = SOURCE_DIR, build_dir: Path = BUILD_DIR) -> list[str]:
    """Why the committed build does not match the sources; empty when it does."""
    try:
        stamp = read_stamp(build_dir)
    except (OSError, ValueError) as e:
        return [f"cannot read {build_dir / STAMP_NAME}: {e}"]
    fresh = make_stamp(source_dir, build_dir)
    reasons = []
    if stamp.get("sources_sha256") != fresh["sources_sha256"]:
        old = stamp.get("sources", {})
        changed = sorted(p for p in set(old) | set(fresh["sources"])
                         if old.get(p) != fresh["sources"].get(p))
        reasons.append(f"sources changed since the build: {', '.join(changed) or '?'}")
    if stamp.get("build") != fresh["build"]:
        old = stamp.get("build", {})
        changed = sorted(p for p in set(old) | set(fresh["build"])
                         if old.get(p) != fresh["build"].get(p))
        reasons.append(f"build files differ from the stamp: {', '.join(changed)}")
    return reasons


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only check the stamp; exit 1 when it is stale")
    args = parser.parse_args(argv)
    if args.check:
        reasons = stale_reasons()
        for reason in reasons:
            print(f"stale: {reason}; run `make labextension`", file=sys.stderr)
        return 1 if reasons else 0
    if not (BUILD_DIR / "package.json").is_file():
        print(f"no build in {BUILD_DIR}; run `jupyter labextension build` first",
              file=sys.stderr)
        return 1
    shutil.copyfile(SOURCE_DIR / "install.json", BUILD_DIR / "install.json")
    stamp = make_stamp()
    (BUILD_DIR / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {BUILD_DIR / STAMP_NAME}: sources {stamp['sources_sha256'][:12]}, "
          f"{len(stamp['build'])} build files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
