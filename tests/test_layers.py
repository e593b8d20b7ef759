"""Rules of the import graph, read from the source with `ast` (nothing is imported to check them).

- no circles among the project's modules (app, commands.*, loop.*, annotate.*, rlhf.*); a package's __init__
  importing its own submodules (or they it) is not a circle;
- nothing imports `app`; imports go app.py -> commands -> loop -> annotate, rlhf:
- `annotate.*` (people and data) never imports rlhf, loop, commands, a model library (torch, transformers,
  accelerate, peft) or a process library (subprocess, multiprocessing);
- `rlhf.*` (training) never imports annotate, loop or commands;
- `loop.*` never imports commands;
- no private helper (`_name`) is imported from another module;
- no file of app.py, commands/, loop/, annotate/, rlhf/ is over MAX_LINES lines;
- no function of theirs is over MAX_FUNCTION_LINES lines of code (its docstring not counted) or takes more than
  MAX_PARAMETERS parameters (self and cls not counted), but those listed in FUNCTION_SIZE_EXCEPTIONS with the reason.
Each failure names the importing module, its file and line, and what it imports.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("commands", "loop", "annotate", "rlhf")
MAX_LINES = 420
MODEL_LIBRARIES = ("torch", "transformers", "accelerate", "peft")
PROCESS_LIBRARIES = ("subprocess", "multiprocessing")
NOT_IMPORTED_BY = {
    "annotate": ("rlhf", "loop", "commands", *MODEL_LIBRARIES, *PROCESS_LIBRARIES),
    "rlhf": ("annotate", "loop", "commands"),
    "loop": ("commands",),
}
"""Package -> the top-level modules it must never import."""
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 8
FUNCTION_SIZE_EXCEPTIONS: dict[str, str] = {}
"""module.function -> why it may be longer or take more: none today."""
DYNAMIC_TARGET = re.compile(r"^((?:app|commands|loop|annotate|rlhf)(?:\.\w+)*):\w+$")
"""A "module:function" string (app.py's command table), which app.py imports with importlib."""


@dataclass(frozen=True)
class Import:
    importer: str
    """The importing module."""
    path: str
    """Its file, relative to the root."""
    line: int
    module: str
    """The module imported (absolute: relative imports are resolved)."""
    names: tuple[str, ...] = ()
    """The names of `from module import names` (empty for `import module`)."""

    def where(self) -> str:
        what = f"from {self.module} import {', '.join(self.names)}" if self.names else f"import {self.module}"
        return f"{self.importer} ({self.path}:{self.line}): {what}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def project_files(root: Path) -> dict[str, Path]:
    """Module name -> file, for app.py and every .py file under commands/, annotate/ and rlhf/."""
    files = [root / "app.py"] if (root / "app.py").is_file() else []
    for package in PACKAGES:
        if (root / package).is_dir():
            files += sorted((root / package).rglob("*.py"))
    return {module_name(path, root): path for path in files}


def imports_of(name: str, path: Path, root: Path) -> list[Import]:
    """Every import statement of the file (at any depth: inside functions too), plus importlib.import_module("x")
    calls and "module:function" strings naming a project module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    relative = str(path.relative_to(root))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(name, relative, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([module] if module else []))
            found.append(Import(name, relative, node.lineno, module, tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == \
                "import_module" and node.args and isinstance(node.args[0], ast.Constant) and \
                isinstance(node.args[0].value, str):
            found.append(Import(name, relative, node.lineno, node.args[0].value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                (match := DYNAMIC_TARGET.match(node.value)):
            found.append(Import(name, relative, node.lineno, match.group(1)))
    return found


def all_imports(root: Path) -> list[Import]:
    return [imp for name, path in project_files(root).items() for imp in imports_of(name, path, root)]


def own_targets(imp: Import, known: set[str]) -> set[str]:
    """The project modules an import runs: the module (or its closest known package) and, for `from package import
    x`, the submodule package.x when there is one."""
    targets = set()
    for candidate in [imp.module] + [f"{imp.module}.{name}" for name in imp.names]:
        while candidate and candidate not in known:
            candidate = candidate.rpartition(".")[0]
        if candidate:
            targets.add(candidate)
    return targets


def is_package_and_own_submodule(a: str, b: str, files: dict[str, Path]) -> bool:
    """a package's __init__ importing its own submodule, or a submodule importing its own package."""
    return (b.startswith(a + ".") and files[a].name == "__init__.py") or \
        (a.startswith(b + ".") and files[b].name == "__init__.py")


def import_graph(root: Path) -> dict[str, dict[str, list[Import]]]:
    """importer -> imported project module -> the imports that make the edge."""
    files = project_files(root)
    known = set(files)
    graph: dict[str, dict[str, list[Import]]] = {name: {} for name in files}
    for imp in all_imports(root):
        for target in own_targets(imp, known):
            if target != imp.importer and not is_package_and_own_submodule(imp.importer, target, files):
                graph[imp.importer].setdefault(target, []).append(imp)
    return graph


def strongly_connected(graph: dict[str, dict]) -> list[list[str]]:
    """Tarjan's components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def circle_violations(root: Path) -> list[str]:
    graph = import_graph(root)
    problems = []
    for component in strongly_connected(graph):
        edges = [imp.where() for a in component for b, imps in sorted(graph[a].items()) if b in component
                 for imp in imps]
        problems.append(f"import circle among {', '.join(component)}:\n    " + "\n    ".join(edges))
    return problems


def imports_app_violations(root: Path) -> list[str]:
    return [f"{imp.where()} -- nothing may import app" for imp in all_imports(root)
            if imp.module == "app" or imp.module.startswith("app.")]


def _top(module: str) -> str:
    return module.split(".")[0]


def layer_violations(root: Path) -> list[str]:
    problems = []
    for imp in all_imports(root):
        refused = NOT_IMPORTED_BY.get(_top(imp.importer), ())
        if _top(imp.module) in refused:
            problems.append(f"{imp.where()} -- {_top(imp.importer)}/ must not import {', '.join(refused)}")
    return problems


def private_import_violations(root: Path) -> list[str]:
    return [f"{imp.where()} -- imports the private helper(s) "
            f"{', '.join(n for n in imp.names if n.startswith('_') and not n.startswith('__'))} of another module"
            for imp in all_imports(root)
            if any(name.startswith("_") and not name.startswith("__") for name in imp.names)]


def long_file_violations(root: Path, max_lines: int = MAX_LINES) -> list[str]:
    problems = []
    for name, path in project_files(root).items():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > max_lines:
            problems.append(f"{name} ({path.relative_to(root)}) has {lines} lines, over {max_lines}")
    return problems


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function from its first decorator to its end, its docstring not counted."""
    start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    lines = node.end_lineno - start + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    arguments = node.args
    names = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    count = len(names) + bool(arguments.vararg) + bool(arguments.kwarg)
    return count - (1 if arguments.args and arguments.args[0].arg in ("self", "cls") else 0)


def function_size_violations(root: Path, exceptions: dict[str, str] = FUNCTION_SIZE_EXCEPTIONS) -> list[str]:
    problems = []
    for name, path in project_files(root).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or f"{name}.{node.name}" in exceptions:
                continue
            where = f"{name}.{node.name} ({path.relative_to(root)}:{node.lineno})"
            if (lines := _code_lines(node)) > MAX_FUNCTION_LINES:
                problems.append(f"{where} has {lines} lines of code, over {MAX_FUNCTION_LINES}: split it into named "
                                "steps")
            if (count := _parameters(node)) > MAX_PARAMETERS:
                problems.append(f"{where} takes {count} parameters, over {MAX_PARAMETERS}: group them")
    return problems


def all_violations(root: Path) -> list[str]:
    return (circle_violations(root) + imports_app_violations(root) + layer_violations(root)
            + private_import_violations(root) + long_file_violations(root) + function_size_violations(root))


# The rules on this repository.

def test_the_checker_sees_the_project():
    files = project_files(REPO)
    assert {"app", "commands.flags", "loop.round", "loop.children.pair_job", "annotate.store", "rlhf.models"} \
        <= set(files)
    graph = import_graph(REPO)
    assert "loop.config_files" in graph["commands.flags"]
    assert "commands.serve" in graph["app"]  # through app.py's "module:function" command table
    assert "annotate.store" in graph["loop.round"]


def test_no_import_circles():
    problems = circle_violations(REPO)
    assert not problems, "\n".join(problems)


def test_nothing_imports_app():
    problems = imports_app_violations(REPO)
    assert not problems, "\n".join(problems)


def test_each_layer_imports_only_the_layers_below_it():
    problems = layer_violations(REPO)
    assert not problems, "\n".join(problems)


def test_no_private_helper_is_imported_from_another_module():
    problems = private_import_violations(REPO)
    assert not problems, "\n".join(problems)


def test_no_file_is_over_the_line_limit():
    problems = long_file_violations(REPO)
    assert not problems, "\n".join(problems)


def test_no_function_is_too_long_or_takes_too_many_parameters():
    problems = function_size_violations(REPO)
    assert not problems, "\n".join(problems)


def test_the_app_server_modules_do_not_import_torch():
    """The annotation server never loads a model; importing its modules must not pull torch in either."""
    code = ("import annotate.store, annotate.ui, annotate.serve, loop.children, loop.children.pair_job, "
            "loop.children.pair_child, loop.children.round_runner, loop.app_server, commands.serve; import sys; "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", (
        "importing the app server's modules imports torch; find the chain with "
        f"`python -X importtime -c \"{code}\" 2>&1 | grep -B5 'torch$'`")


# The checker fails on bad code.

def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


GOOD_TREE = {
    "app.py": 'COMMANDS = [("--x", "commands.work:run")]\n',
    "commands/__init__.py": "",
    "commands/work.py": "from loop.round import run\n\ndef f():\n    from annotate.store import Store\n",
    "loop/__init__.py": "",
    "loop/round.py": "import subprocess\nfrom annotate.store import Store\n\ndef run():\n    from rlhf.models import load\n",
    "annotate/__init__.py": "",
    "annotate/store/__init__.py": "from annotate.store.core import Store\n",
    "annotate/store/core.py": "from annotate.store import sql\nimport threading\n",
    "annotate/store/sql.py": "",
    "rlhf/__init__.py": "",
    "rlhf/models.py": "import torch\nimport transformers\n",
}


def test_the_checker_passes_a_good_tree(tmp_path):
    _write(tmp_path, GOOD_TREE)
    assert all_violations(tmp_path) == []


def test_a_listed_exception_may_be_long(tmp_path):
    _write(tmp_path, {**GOOD_TREE, "loop/long.py": "def f():\n" + "    x = 1\n" * (MAX_FUNCTION_LINES + 1)})
    assert function_size_violations(tmp_path, {})
    assert function_size_violations(tmp_path, {"loop.long.f": "measured: splitting it hid the algorithm"}) == []


@pytest.mark.parametrize("files, expected", [
    ({"annotate/bad.py": "from rlhf.models import load\n"},
     "annotate.bad (annotate/bad.py:1): from rlhf.models import load"),
    ({"annotate/bad.py": "def f():\n    import torch\n"}, "annotate.bad (annotate/bad.py:2): import torch"),
    ({"annotate/bad.py": "from commands import work\n"}, "annotate.bad (annotate/bad.py:1): from commands import work"),
    ({"annotate/bad.py": "from peft import LoraConfig\n"}, "annotate.bad (annotate/bad.py:1): from peft"),
    ({"annotate/bad.py": "import subprocess\n"}, "annotate.bad (annotate/bad.py:1): import subprocess"),
    ({"annotate/bad.py": "from loop.round import run\n"}, "annotate.bad (annotate/bad.py:1): from loop.round"),
    ({"rlhf/bad.py": "from annotate.store import Store\n"}, "rlhf.bad (rlhf/bad.py:1): from annotate.store"),
    ({"rlhf/bad.py": "def f():\n    from loop import round\n"}, "rlhf.bad (rlhf/bad.py:2): from loop import round"),
    ({"rlhf/bad.py": "import commands.work\n"}, "rlhf.bad (rlhf/bad.py:1): import commands.work"),
    ({"loop/bad.py": "from commands.work import f\n"}, "loop.bad (loop/bad.py:1): from commands.work import f"),
    ({"rlhf/bad.py": "import app\n"}, "rlhf.bad (rlhf/bad.py:1): import app -- nothing may import app"),
    ({"commands/bad.py": "from annotate.store.core import _helper\n"},
     "commands.bad (commands/bad.py:1): from annotate.store.core import _helper -- imports the private helper"),
    ({"commands/a.py": "from commands.b import f\n", "commands/b.py": "def g():\n    from commands import a\n"},
     ("import circle among commands.a, commands.b:\n    commands.a (commands/a.py:1): from commands.b import f\n"
      "    commands.b (commands/b.py:2): from commands import a")),
    ({"rlhf/a.py": "from . import b\n", "rlhf/b.py": "from .a import x\n"},
     "import circle among rlhf.a, rlhf.b"),
    ({"annotate/big.py": "x = 1\n" * (MAX_LINES + 1)},
     f"annotate.big (annotate/big.py) has {MAX_LINES + 1} lines, over {MAX_LINES}"),
    ({"loop/long.py": 'def f():\n    """A docstring."""\n' + "    x = 1\n" * MAX_FUNCTION_LINES},
     f"loop.long.f (loop/long.py:1) has {MAX_FUNCTION_LINES + 1} lines of code, over {MAX_FUNCTION_LINES}"),
    ({"rlhf/wide.py": "class A:\n    def f(self, a, b, c, d, e, g, h, i, *rest):\n        pass\n"},
     f"rlhf.wide.f (rlhf/wide.py:2) takes {MAX_PARAMETERS + 1} parameters, over {MAX_PARAMETERS}"),
])
def test_the_checker_reports_a_bad_tree(tmp_path, files, expected):
    _write(tmp_path, {**GOOD_TREE, **files})
    problems = all_violations(tmp_path)
    assert any(expected in problem for problem in problems), "\n".join(problems) or "nothing reported"
