"""Check that pip resolves the project's extras at once: each alone, all together, and beside moto's S3 server.

pip prints "pip is looking at multiple versions of X" when its first choice of X conflicts with another
requirement and it starts walking back through X's releases. With packages that publish almost daily (boto3,
botocore) that walk takes many minutes on a fresh machine and can end in ResolutionImpossible, so any such line is
a failure here, even when pip found an answer this time.

Each case is a ``pip install --dry-run --ignore-installed`` (nothing is installed; pip reads the packages' metadata
from the index, so it needs the package index). One more case resolves ``.[storage]`` over the environment as it
is installed (``pip install -e '.[dev]'``): it must keep every installed version, since a second install that
swaps boto3 or botocore under moto breaks the first.

Usage: ``python scripts/check_resolution.py [--only NAME ...] [--jobs N]``. Prints one JSON object: each case's
requirements, seconds, whether pip backtracked and what it would change; exits 1 when any case failed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
BACKTRACK = re.compile(r"looking at multiple versions", re.IGNORECASE)


def extras() -> list[str]:
    """The optional extras pyproject.toml declares, in its order."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["optional-dependencies"])


def cases(selected: list[str] | None) -> dict[str, dict[str, object]]:
    """Name -> how to resolve it: the requirements and whether installed packages count."""
    names = extras()
    out: dict[str, dict[str, object]] = {name: {"reqs": [f".[{name}]"], "fresh": True} for name in names}
    out["all extras"] = {"reqs": [f".[{','.join(names)}]"], "fresh": True}
    out["storage + moto[server]"] = {"reqs": [".[storage]", "moto[server]"], "fresh": True}
    out["storage over the installed env"] = {"reqs": [".[storage]"], "fresh": False}
    if selected:
        unknown = [name for name in selected if name not in out]
        if unknown:
            raise SystemExit(f"check_resolution: no case named {unknown}; cases: {list(out)}")
        out = {name: out[name] for name in selected}
    return out


def resolve(name: str, reqs: list[str], fresh: bool) -> dict[str, object]:
    """One dry run; what pip would install, and whether it walked back through versions to find it."""
    report = ROOT / ".cache" / f"resolution-{re.sub(r'[^a-z0-9]+', '-', name.lower())}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--report", str(report), *reqs]
    if fresh:
        cmd.insert(4, "--ignore-installed")
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0 and not BACKTRACK.search(proc.stdout + proc.stderr):
        # a failed request to the index is not a resolution problem: one more try before calling it one
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = round(time.perf_counter() - start, 1)
    log = proc.stdout + proc.stderr
    backtracked = sorted({line.strip() for line in log.splitlines() if BACKTRACK.search(line)})
    would: list[str] = []
    if report.exists():
        items = json.loads(report.read_text()).get("install", [])
        would = sorted(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in items)
        report.unlink()
    result: dict[str, object] = {"requirements": reqs, "seconds": seconds, "returncode": proc.returncode}
    result["backtracked"] = backtracked
    if fresh:
        result["packages"] = len(would)
    else:
        # Over the installed environment only the project itself may be (re)installed.
        result["would_change"] = [w for w in would if not w.lower().startswith("segtrain-torch==")]
    ok = proc.returncode == 0 and not backtracked and not result.get("would_change")
    result["ok"] = ok
    if not ok:
        result["log_tail"] = log.splitlines()[-15:]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="run only these cases")
    parser.add_argument("--jobs", type=int, default=4, help="dry runs at a time (they mostly wait on the index)")
    args = parser.parse_args()
    todo = cases(args.only)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {
            name: pool.submit(resolve, name, list(spec["reqs"]), bool(spec["fresh"]))  # type: ignore[call-overload]
            for name, spec in todo.items()
        }
        results = {name: future.result() for name, future in futures.items()}
    failed = [name for name, result in results.items() if not result["ok"]]
    summary = {"cases": results, "failed": failed, "seconds": round(time.perf_counter() - start, 1)}
    print(json.dumps(summary, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
