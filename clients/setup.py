"""Build of tgc-rl-client: the modules pyproject.toml's [tool.tgc-client] names, taken from the repository root.

setuptools ships every module of a package it includes; `tgc_rl` also holds the trainer's and the server's
modules, so the build keeps only the named ones (and fails when one is missing rather than ship a partial client).
"""

import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODULES = frozenset(tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["tgc-client"]["modules"])
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


class ClientModulesOnly(build_py):
    def find_package_modules(self, package, package_dir):
        found = super().find_package_modules(package, package_dir)
        kept = [(pkg, mod, path) for pkg, mod, path in found if _relative(path) in MODULES]
        return kept

    def run(self):
        missing = sorted(m for m in MODULES if not (ROOT / m).is_file())
        if missing:
            raise SystemExit(f"tgc-rl-client: [tool.tgc-client] modules not found: {', '.join(missing)}")
        super().run()


def _relative(path: str) -> str:
    return (HERE / path).resolve().relative_to(ROOT).as_posix()


setup(
    version=VERSION,
    package_dir={"": ".."},
    packages=sorted({str(Path(m).parent).replace("/", ".") for m in MODULES}),
    cmdclass={"build_py": ClientModulesOnly},
)
