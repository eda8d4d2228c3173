"""The JavaScript client's TypeScript declarations against docs/asyncapi.yaml, and its package.

`clients/js/src/frames.d.ts` is generated from docs/asyncapi.yaml (itself generated from
edge/protocol.py) by clients/js/gen_types.py; the hand-written index.d.ts declares every export
of index.js. Where a TypeScript compiler is at hand (`tsc` on PATH, or $TSC) the declarations are
compiled against an application's use of them; where npm is, `npm pack` must pack them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / "clients" / "js"
ASYNCAPI: dict[str, Any] = yaml.safe_load((ROOT / "docs" / "asyncapi.yaml").read_text())


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_types", JS / "gen_types.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_frames_match_asyncapi() -> None:
    assert (JS / "src" / "frames.d.ts").read_text() == _generator().render(), (
        "clients/js/src/frames.d.ts is out of date with docs/asyncapi.yaml: "
        "run python clients/js/gen_types.py"
    )


def test_every_frame_type_and_field_is_declared() -> None:
    dts = (JS / "src" / "frames.d.ts").read_text()
    for name, schema in ASYNCAPI["components"]["schemas"].items():
        kind = schema["properties"].get("type", {}).get("const")
        block = re.search(rf"export interface {name}(Frame)? {{\n(.*?)\n}}", dts, re.S)
        assert block, f"{name} is not declared"
        if kind is not None:
            assert f'type: "{kind}";' in block.group(2), name
        for field in schema["properties"]:
            optional = "" if field in schema.get("required", []) else "?"
            assert re.search(rf"^  {field}{re.escape(optional)}: ", block.group(2), re.M), (name, field)


def test_generator_notices_a_new_field() -> None:
    doc = json.loads(json.dumps(ASYNCAPI))
    doc["components"]["schemas"]["Ready"]["properties"]["region"] = {"type": "string"}
    assert "  region?: string;" in _generator().render(doc)


def test_index_declares_every_export() -> None:
    js = (JS / "src" / "index.js").read_text()
    dts = (JS / "src" / "index.d.ts").read_text()
    exported = {n.strip() for group in re.findall(r"export \{([^}]*)\}", js) for n in group.split(",")}
    assert exported >= {"PresenceClient", "reconnectDelay", "describeLastSeen", "chunkIds"}
    for name in exported:
        assert re.search(rf"\b{name}\b", dts), f"index.d.ts does not declare {name}"
    package = json.loads((JS / "package.json").read_text())
    for entry in package["exports"].values():
        assert (JS / entry["types"]).exists() and (JS / entry["default"]).exists(), entry


def test_declarations_compile_against_an_application() -> None:
    tsc = os.environ.get("TSC") or shutil.which("tsc")
    if tsc is None:
        pytest.skip(
            "no TypeScript compiler (set TSC, or npm install -g typescript): declarations not compiled"
        )
    result = subprocess.run(
        [tsc, "--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext",
         "--target", "es2022", "--lib", "es2022,dom", str(JS / "test" / "types-check.ts")],
        cwd=JS, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_npm_pack_packs_the_sources_and_declarations() -> None:
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: the package is not packed")
    result = subprocess.run(
        [npm, "pack", "--dry-run", "--json", "--offline"], cwd=JS, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    files = {f["path"] for f in json.loads(result.stdout)[0]["files"]}
    for name in ("index.js", "index.d.ts", "client.js", "backoff.js", "lastseen.js", "frames.d.ts"):
        assert f"src/{name}" in files, files
    assert not any(f.startswith("test/") for f in files)
