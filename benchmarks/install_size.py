"""``python -m benchmarks.install_size``: what a new user's install weighs on disk.

A wheel is built from this tree and installed into fresh venvs exactly as the README's
Install section says (its ``pip install`` lines, the wheel standing in for the package
index), and once bare (the wheel alone, no extras). Each venv is weighed with ``du`` (pip
and the interpreter's own venv files included: that is what the user's disk holds), and its
largest installed distributions are listed so a miss names its cause.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import common

README = common.ROOT / "README.md"
TARGET_MB = 400


def readme_install_lines() -> list[list[str]]:
    """The ``pip install`` lines of the README's Install section, as argv lists."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    lines = [ln.split("#", 1)[0].strip() for ln in block.splitlines()]
    return [shlex.split(ln) for ln in lines if ln.startswith("pip install")]


def with_wheel(argv: list[str], wheel: Path) -> list[str]:
    """``argv`` with ``context-search[...]`` replaced by the local wheel (extras kept)."""
    return [
        str(wheel) + a.removeprefix("context-search") if a.startswith("context-search") else a
        for a in argv
    ]


def build_wheel(out: Path) -> Path:
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"),
            *("-w", str(out), str(common.ROOT)),
        ],
        check=True,
    )
    (wheel,) = out.glob("context_search-*.whl")
    return wheel


def _megabytes(path: Path) -> int:
    out = subprocess.run(["du", "-sm", str(path)], check=True, capture_output=True, text=True)
    return int(out.stdout.split()[0])


def _largest(venv: Path, n: int = 8) -> list[tuple[str, int]]:
    """The ``n`` largest top-level entries of the venv's site-packages, in MB."""
    (site,) = venv.glob("lib/python*/site-packages")
    sizes = [(p.name, _megabytes(p)) for p in site.iterdir() if not p.name.endswith(".dist-info")]
    return sorted(sizes, key=lambda kv: -kv[1])[:n]


def _venv(root: Path, installs: list[list[str]]) -> dict[str, Any]:
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    env = {"PATH": f"{root / 'bin'}:/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for argv in installs:
        subprocess.run([str(root / "bin" / "pip"), *argv[1:], "-q"], check=True, env=env)
    torch = subprocess.run(
        [str(root / "bin" / "python"), "-c", "import torch"], capture_output=True, env=env
    )
    return {
        "installs": [" ".join(a) for a in installs],
        "mb": _megabytes(root),
        "largest_mb": _largest(root),
        "torch_importable": torch.returncode == 0,
    }


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cs-install-") as tmp:
        work = Path(tmp)
        wheel = build_wheel(work / "dist")
        readme = [with_wheel(a, wheel) for a in readme_install_lines()]
        bare = _venv(work / "bare", [["pip", "install", str(wheel)]])
        common.log(f"install size, the wheel alone: {bare['mb']} MB")
        full = _venv(work / "readme", readme)
        common.log(f"install size, the README's Install lines: {full['mb']} MB")
    return {
        "python": sys.version.split()[0],
        "readme_lines": [" ".join(a) for a in readme_install_lines()],
        "bare": bare,
        "readme": full,
        "target_mb": TARGET_MB,
        "met": full["mb"] < TARGET_MB,
    }


def markdown(result: dict[str, Any]) -> str:
    # The lines as the README gives them (the run installed the wheel in their place).
    sides = (
        ("the wheel alone", ["pip install context-search"], result["bare"]),
        ("README Install", result["readme_lines"], result["readme"]),
    )
    rows = [
        [
            name,
            "<br>".join(f"`{line}`" for line in shown),
            side["mb"],
            ", ".join(f"{n} {mb}" for n, mb in side["largest_mb"]),
            "yes" if side["torch_importable"] else "no",
        ]
        for name, shown, side in sides
    ]
    verdict = (
        f"met, by {result['target_mb'] - result['readme']['mb']} MB"
        if result["met"]
        else f"missed by {result['readme']['mb'] - result['target_mb']} MB"
    )
    return (
        "### Install size\n\n"
        + common.header(result)
        + "\n\n"
        + common.fmt_table(rows, ["venv", "installed with", "MB (du -sm)", "largest (MB)", "torch"])
        + f"\n\nTarget: the README's install below {result['target_mb']} MB — {verdict}. "
        "The wheel stands in for the package index; the venv's own pip is included.\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.install_size", description=__doc__)
    parser.add_argument("--out", type=Path, default=None, help="Scratch output directory.")
    args = parser.parse_args()
    envelope = common.envelope("install-size", [])
    envelope["command"] = "python -m benchmarks.install_size" + (
        f" --out {args.out}" if args.out else ""
    )
    result = {**envelope, **run()}
    out_dir = args.out or common.RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "install-size.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    md = out_dir / "BENCHMARKS.md" if args.out else common.ROOT / "BENCHMARKS.md"
    common.update_benchmarks_md("install-size", markdown(result), md)
    common.log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
