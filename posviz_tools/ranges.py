"""The ends of requirements.txt's ranges, for `make test-lowest` (and the lock's check in the tests).

    python -m posviz_tools.ranges lowest      # every direct requirement at its lower bound: `>=X` taken as `==X`
    python -m posviz_tools.ranges check       # the lock pins every direct requirement within its range

requirements.txt and requirements-test.txt keep true ranges, for people who install posviz beside other things;
requirements.lock pins what the README's commands, CI and the image install. A range's lower end is only true
if the suite passes there: `make test-lowest` installs this module's `lowest` list (pip resolves the rest) and
runs the suite on it, `make test-newest` the newest releases the ranges allow.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements-test.txt"  # includes requirements.txt (-r)
LOCK = ROOT / "requirements.lock"

_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def direct_requirements(path: Path = REQUIREMENTS) -> dict[str, str]:
    """{normalised name: specifier} of a requirements file and the files it includes with ``-r``."""
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            out.update(direct_requirements(path.parent / line[3:].strip()))
            continue
        match = _LINE.match(line)
        if not match:
            raise ValueError(f"{path.name}: cannot read the requirement {raw!r}")
        out[normalise(match.group(1))] = match.group(2).replace(" ", "")
    return out


def lowest(requirements: dict[str, str]) -> list[str]:
    """Each requirement at the lowest version its range allows: ``>=X`` as ``==X``, ``==X`` as it is."""
    pins = []
    for name, spec in sorted(requirements.items()):
        parts = spec.split(",") if spec else []
        low = [p[2:] for p in parts if p.startswith(">=")] or [p[2:] for p in parts if p.startswith("==")]
        if not low:
            raise ValueError(f"{name} has no lower bound ({spec or 'no range'}): give it one in requirements.txt")
        pins.append(f"{name}=={low[0]}")
    return pins


def locked(path: Path = LOCK) -> dict[str, str]:
    """{normalised name: version} of the lock."""
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[normalise(name)] = version.strip()
    return out


def lock_problems(requirements: dict[str, str] | None = None, lock: dict[str, str] | None = None) -> list[str]:
    """What is wrong with the lock, in words: a direct requirement it does not pin, or pins outside its range."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    requirements = direct_requirements() if requirements is None else requirements
    lock = locked() if lock is None else lock
    problems = []
    for name, spec in sorted(requirements.items()):
        if name not in lock:
            problems.append(f"{name} ({spec}) is not in requirements.lock: run `make lock`")
        elif not SpecifierSet(spec).contains(Version(lock[name]), prereleases=True):
            problems.append(f"requirements.lock pins {name}=={lock[name]}, outside {spec}: run `make lock`")
    return problems


def main(argv: list[str]) -> int:
    if argv == ["lowest"]:
        print("\n".join(lowest(direct_requirements())))
        return 0
    if argv == ["check"]:
        problems = lock_problems()
        print("\n".join(problems) or "requirements.lock pins every requirement within its range")
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
