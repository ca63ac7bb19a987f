#!/usr/bin/env python3
"""Write npudoctor/data/server_args.json: every ServerArgs field and launch flag of the sglang
releases, with the first and last release that accepts it.

    python scripts/server_args_history.py            # every release in the cache (.cache/sglang/trees)
    python scripts/server_args_history.py 0.4.10 0.5.1 ... 0.5.23   # these (fetched if missing)
    python scripts/server_args_history.py --check    # exit 1 if the bundled file differs

npudoctor uses the file to tell a name no release knows (a typo: exit 2 with a did-you-mean)
from one another release knows but the release under test lacks (NPD000's finding). Each
release is read statically with ``npudoctor.target.serverargs.read_table`` (never imported); the cache
is ``$NPUDOCTOR_SGLANG_CACHE``, else ``.cache/sglang``, filled by ``scripts/fetch_sglang.py``.
Regenerate it when a new sglang release comes out: fetch it, run this script, commit the file.
Stdlib and npudoctor only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from npudoctor.static.source import SourceTree
from npudoctor.target.serverargs import history_document, history_path, read_table

REPO = Path(__file__).resolve().parent.parent


def _fetch_module():
    spec = importlib.util.spec_from_file_location("fetch_sglang", REPO / "scripts" / "fetch_sglang.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def release_trees(versions: list[str]) -> dict[str, Path]:
    """Release -> the directory holding its ``sglang/``, oldest first."""
    fetch = _fetch_module()
    if versions:
        return {v: fetch.fetch(v) for v in sorted(versions, key=_key)}
    return fetch.cached(finals_only=True)


def build(versions: list[str]) -> dict:
    tables = {}
    for version, tree in release_trees(versions).items():
        table = read_table(SourceTree((tree / "sglang").resolve()))
        if table is None:
            raise SystemExit(f"sglang {version} ({tree}): no ServerArgs npudoctor can read")
        tables[version] = table
    if not tables:
        raise SystemExit("no sglang release in the cache: python scripts/fetch_sglang.py VERSION ...")
    return history_document(tables)


def render(document: dict) -> str:
    """JSON with one name per line (diffs between regenerations show the names that changed)."""
    lines = ["{"]
    items = list(document.items())
    for index, (key, value) in enumerate(items):
        comma = "," if index < len(items) - 1 else ""
        if isinstance(value, dict):
            lines.append(f" {json.dumps(key)}: {{")
            entries = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items()]
            lines.append(",\n".join(entries))
            lines.append(f" }}{comma}")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("versions", nargs="*", help="releases to read (default: every cached one)")
    parser.add_argument(
        "--check", action="store_true", help="compare with the bundled file instead of writing it"
    )
    args = parser.parse_args(argv)
    text = render(build(args.versions))
    target = history_path()
    if args.check:
        current = target.read_text(encoding="utf-8") if target.is_file() else ""
        if current != text:
            print(f"{target} is out of date: run python scripts/server_args_history.py", file=sys.stderr)
            return 1
        print(f"{target} is up to date")
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    document = json.loads(text)
    print(
        f"wrote {target}: {len(document['fields'])} fields, {len(document['flags'])} flags, "
        f"releases {document['releases'][0]}..{document['releases'][-1]} ({len(document['releases'])})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
