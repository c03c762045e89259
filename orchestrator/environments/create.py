"""`bench env NAME --pip SPEC`: an engine environment for the env axis, `.venvs/NAME`, that is a base
environment (by default this interpreter's) with some packages at other versions.

The new venv has no packages of its own but those SPECs: a `.pth` file puts the base's site-packages after
its own on sys.path, so everything else is the base's (the same torch, the same engine), and the packages
installed here (`pip install --target`, without their dependencies unless --deps) shadow the base's. That
is what an A/B of one library needs: two environments that differ in exactly one package, which the
provenance diff of an env pair then names. Offline, pip takes wheels from --find-links with --no-index.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

BASE_PTH = "_bench_base_env.pth"


def _purelib(python: str) -> str:
    return subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()


def create_env(target: Path, pip: list[str], base: str | None = None, find_links: list[str] | None = None,
               no_index: bool = False, deps: bool = False) -> Path:
    """The venv `target` over `base`'s packages, with `pip` installed in it; returns its interpreter.
    Raises CalledProcessError (with pip's output) where pip cannot install a spec."""
    base = base or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", "--clear", str(target)], check=True, capture_output=True)
    python = target / "bin" / "python"
    site = Path(_purelib(str(python)))
    (site / BASE_PTH).write_text(_purelib(base) + "\n")
    if pip:
        cmd = [base, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target", str(site),
               *([] if deps else ["--no-deps"]), *(["--no-index"] if no_index else [])]
        for link in find_links or []:
            cmd += ["--find-links", link]
        subprocess.run(cmd + list(pip), check=True, capture_output=True, text=True)
    return python


def installed(python: Path, names: list[str]) -> dict[str, str]:
    """The versions `python` imports of these distributions (what a cell's provenance will record)."""
    code = ("import importlib.metadata as m, sys\n"
            "for n in sys.argv[1:]:\n"
            "    try: print(n, m.version(n))\n"
            "    except m.PackageNotFoundError: print(n, '(not installed)')\n")
    out = subprocess.run([str(python), "-c", code, *names], check=True, capture_output=True, text=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def env_cmd(name: str = typer.Argument(..., help="The env's name: creates .venvs/NAME"),
            pip: list[str] = typer.Option(..., "--pip", help="A pip requirement installed over the base, e.g. "
                                          "tqdm==4.67.1 (repeatable)"),
            base: Optional[str] = typer.Option(None, help="The base environment's interpreter (default: this one)"),
            find_links: list[str] = typer.Option([], "--find-links", help="A folder of wheels (repeatable)"),
            no_index: bool = typer.Option(False, "--no-index", help="Only --find-links: no package index"),
            deps: bool = typer.Option(False, "--deps", help="Also install the specs' dependencies into the env"),
            root: Path = typer.Option(Path(".venvs"), help="Where the env's folder goes")) -> None:
    """Create an engine environment for the env axis: BASE's packages with the --pip specs over them. Name its
    interpreter in the matrix: envs: {NAME: {python: .venvs/NAME/bin/python}}."""
    try:
        python = create_env(root / name, pip, base, find_links, no_index, deps)
    except subprocess.CalledProcessError as err:
        typer.echo(f"bench env {name}: {' '.join(map(str, err.cmd[:4]))} ... failed:\n{err.stderr or err.stdout}",
                   err=True)
        raise typer.Exit(2) from None
    names = [p.split("==")[0].split(">")[0].split("<")[0].split("[")[0].strip() for p in pip]
    versions = ", ".join(f"{n} {v}" for n, v in installed(python, names).items())
    typer.echo(f"{python}: {versions}\nmatrix: envs: {{{name}: {{python: {python}}}}}")
