"""The library stands apart from its tools (issue 19): no library module imports
``convgen.tools``, the CLI's commands share helpers through ``convgen.tools.cli_common``
rather than each other's private names, and ``CONVGEN_*`` settings are read in
``convgen/config.py`` alone."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "convgen"
# The one module outside tools/ that is a tool: the command's entry point, kept at its path
# for `python -m convgen.cli` and the console script.
ENTRY_POINT = PKG / "cli.py"
LIBRARY = sorted(p for p in PKG.glob("*.py") if p != ENTRY_POINT)
TOOLS = sorted((PKG / "tools").rglob("*.py"))


def _imports(path: Path) -> list[str]:
    """Absolute names of every module `path` imports (relative imports resolved)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append(mod)
            out += [f"{mod}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("convgen.tools"):
            out.append(node.value)  # importlib.import_module("convgen.tools...")
    return out


def test_the_scan_resolves_relative_imports():
    names = _imports(PKG / "tools" / "bench" / "harness.py")
    assert "convgen.tools.timing" in names and "convgen.ir" in names


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.name)
def test_no_library_module_imports_the_tools(path):
    bad = [n for n in _imports(path) if n == "convgen.tools" or n.startswith("convgen.tools.")]
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", TOOLS + [ENTRY_POINT], ids=lambda p: str(p.relative_to(PKG)))
def test_no_command_imports_the_cli_module(path):
    assert not [n for n in _imports(path) if n == "convgen.cli" or n.startswith("convgen.cli.")], path


def test_importing_the_library_loads_no_tool():
    code = ("import sys, convgen, convgen.runtime, convgen.compile, convgen.tuning_db, convgen.config, "
            "convgen.fsio, convgen.reference, convgen.planner, convgen.emit; "
            "print(sorted(m for m in sys.modules if m.startswith('convgen.tools') or m == 'convgen.cli'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_settings_are_read_in_the_config_module_only():
    """No module but config.py has a CONVGEN_ variable's bare name as a string, the form an
    environment read needs (messages that mention one are longer strings)."""
    import re

    from convgen import config

    declared = {s.name for s in config.SETTINGS}
    found = set()
    for path in LIBRARY + TOOLS + [ENTRY_POINT]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"CONVGEN_[A-Z0-9_]+", node.value):
                if path.name == "config.py":
                    found.add(node.value)
                else:
                    pytest.fail(f"{path.relative_to(PKG)} names {node.value}: read it through convgen.config")
    assert found == declared


def test_settings_are_read_at_use(monkeypatch, tmp_path):
    from convgen import config
    from convgen.compile import cache_dir
    from convgen.tuning_db import user_db_path

    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path / "a"))
    assert cache_dir() == tmp_path / "a" and user_db_path() == tmp_path / "a" / "tuning.json"
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path / "b"))
    assert cache_dir() == tmp_path / "b"
    for value, enabled in (("0", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv("CONVGEN_TUNED", value)
        assert config.TUNED.enabled() is enabled, value
    monkeypatch.delenv("CONVGEN_TUNED")
    assert config.TUNED.enabled() is True
    with config.overridden(config.CACHE_DIR, str(tmp_path / "c")):
        assert cache_dir() == tmp_path / "c"
    assert cache_dir() == tmp_path / "b"


def test_atomic_write_replaces_whole_files_and_leaves_no_temp(tmp_path):
    from convgen.fsio import atomic_write

    path = tmp_path / "d" / "f.json"
    atomic_write(path, "one")
    atomic_write(path, b"two")
    assert path.read_bytes() == b"two" and [p.name for p in path.parent.iterdir()] == ["f.json"]
    assert path.stat().st_mode & 0o777 == 0o644  # readable by the other users of a shared cache
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        atomic_write(tmp_path / "file" / "under-a-file", "y")


def test_every_package_ships_in_the_wheel():
    """pyproject lists its packages by hand (templates/ ships as convgen.templates), so a new
    subpackage left off the list is missing from a wheel: `convgen bench` and `convgen tune`
    (convgen.tools) then fail on a non-editable install while every editable test passes."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in PKG.rglob("__init__.py")}
    assert found <= listed, f"packages missing from pyproject's [tool.setuptools] packages: {sorted(found - listed)}"
