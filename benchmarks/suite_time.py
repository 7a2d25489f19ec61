"""The test suite's wall time here and at another revision, side by side: ``make test`` in each tree, one after the
other on the same machine, and ``pytest -m unit`` here.

    .venv/bin/python benchmarks/suite_time.py --against REV [--repeats 1]

``REV`` is checked out into a temporary git worktree (outside the repository) with its own ``.venv`` (``make
install`` there, not timed; the first time takes a minute or two). Each repeat runs ``make test`` there, then
here, then ``pytest -m unit`` here, and reads each run's last line (how many passed, failed, skipped). The trees
take turns so both see the same machine load; on a shared machine read the ratio, and the median over repeats.

Output: Markdown on stdout (command, machine, one row per tree and repeat, the median ratio). Bad arguments
print one ``error:`` line and exit 2.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _cli import Parser, run

REPO = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"^=* ?(\d+ (passed|failed).*) in [\d.]+s", re.MULTILINE)


def timed(command: list[str], cwd: Path) -> tuple[float, int, str]:
    """Seconds, exit code and pytest's summary line of ``command`` run in ``cwd``."""
    began = time.monotonic()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    seconds = time.monotonic() - began
    found = SUMMARY.findall(done.stdout + done.stderr)
    return seconds, done.returncode, found[-1][0] if found else f"no summary (exit {done.returncode})"


def commit_of(tree: Path, rev: str = "HEAD") -> str:
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=tree, capture_output=True, text=True,
                          check=True).stdout.strip()


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the revision to compare with (a commit, tag or branch)")
    parser.add_argument("--repeats", type=int, default=1, help="how many turns of both trees (default 1)")
    args = parser.parse_args()
    parser.at_least(args, 1, "repeats")
    parser.commit(args.against, "--against")
    other = Path(tempfile.mkdtemp(prefix="rrfp-suite-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(other), args.against], cwd=REPO, check=True,
                   capture_output=True)
    env_python = os.environ.get("PYTHON", sys.executable)
    rows = []
    try:
        for tree in (other, REPO):
            subprocess.run(["make", "install", f"PYTHON={env_python}"], cwd=tree, check=True, capture_output=True)
        for repeat in range(args.repeats):
            there = timed(["make", "test"], other)
            here = timed(["make", "test"], REPO)
            unit = timed([str(REPO / ".venv" / "bin" / "python"), "-m", "pytest", "-m", "unit", "-p",
                          "no:cacheprovider"], REPO)
            rows.append((repeat, there, here, unit))
            print(f"repeat {repeat + 1}: {args.against} {there[0]:.0f} s, here {here[0]:.0f} s, "
                  f"unit {unit[0]:.1f} s", file=sys.stderr)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=REPO, capture_output=True)
        shutil.rmtree(other.parent, ignore_errors=True)
    here_commit = commit_of(REPO)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    print(f"`.venv/bin/python benchmarks/suite_time.py --against {args.against} --repeats {args.repeats}`\n")
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"here = {here_commit}{' (with uncommitted changes)' if dirty else ''}, "
          f"{args.against} = {commit_of(REPO, args.against)}\n")
    print("| repeat | tree | command | seconds | exit | tests |")
    print("|---|---|---|---|---|---|")
    for repeat, there, here, unit in rows:
        print(f"| {repeat + 1} | {args.against} | `make test` | {there[0]:.0f} | {there[1]} | {there[2]} |")
        print(f"| {repeat + 1} | here | `make test` | {here[0]:.0f} | {here[1]} | {here[2]} |")
        print(f"| {repeat + 1} | here | `pytest -m unit` | {unit[0]:.1f} | {unit[1]} | {unit[2]} |")
    ratio = statistics.median(here[0] / there[0] for _, there, here, _ in rows)
    print(f"\nMedian ratio here / {args.against} (`make test`): {ratio:.2f}")


if __name__ == "__main__":
    run(main)
