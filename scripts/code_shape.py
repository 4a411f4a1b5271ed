#!/usr/bin/env python
"""The shape of the code a newcomer reads: the longest files and functions of ``segtrain/``, and
how many files there are per package. Counts lines as they stand in the file (docstrings and comments
included), functions from their ``def`` to their last line (nested ones counted in their own right too).

Prints ONE JSON object.

    python scripts/code_shape.py [--top 5]
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "segtrain"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    files, functions = [], []
    per_package: Counter[str] = Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        text = path.read_text()
        files.append((text.count("\n"), rel))
        per_package[path.parent.relative_to(PACKAGE.parent).as_posix()] += 1
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.append((node.end_lineno - node.lineno + 1, f"{rel}::{node.name}"))  # type: ignore[operator]
    files.sort(reverse=True)
    functions.sort(reverse=True)
    print(
        json.dumps(
            {
                "files": len(files),
                "lines": sum(n for n, _ in files),
                "files_per_package": dict(sorted(per_package.items())),
                "longest_files": [{"file": f, "lines": n} for n, f in files[: args.top]],
                "longest_functions": [{"function": f, "lines": n} for n, f in functions[: args.top]],
                "functions_over_100_lines": sum(n > 100 for n, _ in functions),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
