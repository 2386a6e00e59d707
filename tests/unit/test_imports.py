"""Packages import downward only, and nothing imports in a cycle: the import-linter contracts of pyproject.toml
([tool.importlinter]: the contract under the core under the server, the client library on the contract alone,
the tools on top, no cycles between sibling modules), checked by import-linter (in this process) on the installed packages; and
the scripts outside any package (benchmarks/, tools/locust/), which import-linter does not see, import no private
name of the project's packages."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import tomllib
from pathlib import Path

import pytest
from importlinter import cli

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
CONFIG = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
CONTRACTS = [contract["name"] for contract in CONFIG["contracts"]]
SCRIPT_DIRS = [ROOT / "benchmarks", ROOT / "tools" / "locust"]


@pytest.fixture(scope="module")
def lint_report() -> str:
    """import-linter's report on every contract (no cache written into the checkout)."""
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(io.StringIO()) as out:
        env.setenv("COLUMNS", "500")  # rich wraps a contract's name at the terminal's width
        env.setenv("NO_COLOR", "1")
        env.chdir(ROOT)
        cli.lint_imports(config_filename=str(PYPROJECT), no_cache=True, no_logo=True)
    report = out.getvalue()
    assert re.search(r"^Contracts: \d+ kept, \d+ broken\.$", report, re.M), report  # it ran, whatever it found
    return report


def _verdict(report: str, name: str) -> str | None:
    found = re.search(rf"^{re.escape(name)} (KEPT|BROKEN)$", report, re.M)
    return found and found[1]


def _broken_section(report: str, name: str) -> str:
    """What lint-imports says of one broken contract: its offending imports, line by line."""
    start = report.rfind(f"\n{name}\n")
    following = [report.find(f"\n{other}\n", start + 1) for other in CONTRACTS if other != name]
    end = min([i for i in following if i > start], default=len(report))
    return report[start:end].strip() if start >= 0 else report


@pytest.mark.parametrize("name", CONTRACTS)
def test_import_contract_is_kept(lint_report, name):
    verdict = _verdict(lint_report, name)
    assert verdict is not None, f"lint-imports did not check {name!r}:\n{lint_report}"
    assert verdict == "KEPT", _broken_section(lint_report, name)


def _first_party(module: str) -> bool:
    return module.split(".")[0] in CONFIG["root_packages"]


def _private_names(path: Path) -> list[str]:
    """`from adaflash... import _x`, `import adaflash._x` and `module._x` on a first-party module in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and _first_party(node.module):
            for alias in node.names:
                if alias.name.startswith("_") or any(p.startswith("_") for p in node.module.split(".")):
                    found.append(f"{path.name}:{node.lineno} from {node.module} import {alias.name}")
                modules.add(alias.asname or alias.name)  # maybe a module (`from adaflash.models import graphs`)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _first_party(alias.name):
                    if any(p.startswith("_") for p in alias.name.split(".")):
                        found.append(f"{path.name}:{node.lineno} import {alias.name}")
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in modules):
            found.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("folder", SCRIPT_DIRS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_scripts_import_no_private_name_of_the_packages(folder):
    scripts = sorted(folder.glob("*.py"))
    assert scripts, folder
    assert [hit for script in scripts for hit in _private_names(script)] == []


def test_private_name_check_sees_each_form(tmp_path):
    script = tmp_path / "bench_x.py"
    script.write_text("from adaflash.decoding.costs import _typical_ms, typical_ms\nimport adaflash.models._x\n"
                      "from adaflash.models import graphs\ngraphs._shape\ngraphs.bucket\nimport os\nos._exit\n")
    assert _private_names(script) == ["bench_x.py:1 from adaflash.decoding.costs import _typical_ms",
                                      "bench_x.py:2 import adaflash.models._x", "bench_x.py:4 graphs._shape"]
