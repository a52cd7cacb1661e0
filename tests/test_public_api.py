"""The package's public face: every module a script imports lists its names in ``__all__``, each of them
exists and is documented where it is defined, and no helper of the module's own leaks out unexported."""

import ast
import importlib
import inspect
import sys
from pathlib import Path

import pytest

#: The modules a script imports, as it imports torch.distributed and torch.nn.parallel.
PUBLIC = ("npddp", "npddp.comm", "npddp.parallel", "npddp.parallel.zero", "npddp.parallel.model", "npddp.nn",
          "npddp.data", "npddp.optim", "npddp.results")


def source_of(module) -> Path:
    return Path(inspect.getsourcefile(module))


def defining_module(module, name: str) -> str:
    """The module whose source defines ``name`` of ``module``, following ``from X import name`` down the chain."""
    lazy = getattr(module, "_EXPORTS", {})
    where = lazy.get(name, module.__name__)          # npddp's names are imported on first use from _EXPORTS
    while True:
        source = source_of(importlib.import_module(where)).read_text()
        imported = [n.module for n in ast.parse(source).body if isinstance(n, ast.ImportFrom)
                    and any(a.name == name and a.asname is None for a in n.names)]
        if not imported:
            return where
        where = imported[0]


def undocumented(module_name: str, name: str) -> str | None:
    """Why ``name`` (defined at the top level of module ``module_name``) counts as undocumented, or None.

    A class or function needs its own docstring; any other value a ``#:`` comment on the lines just above
    its assignment (the form Sphinx reads), or a mention in the module's docstring.
    """
    tree = ast.parse(source_of(importlib.import_module(module_name)).read_text())
    lines = source_of(importlib.import_module(module_name)).read_text().splitlines()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return None if ast.get_docstring(node) else f"{module_name}.{name} has no docstring"
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if any(getattr(t, "id", None) == name for t in targets):
            above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
            if above.startswith("#:") or f"``{name}``" in (ast.get_docstring(tree) or "") or name == "__version__":
                return None
            return f"{module_name}.{name} has no '#:' comment above its assignment"
    return f"{module_name} does not define {name} at its top level"


def own_helpers(module) -> list[str]:
    """Functions and classes ``module``'s own file defines at its top level with a public name, not in ``__all__``."""
    tree = ast.parse(source_of(module).read_text())
    return [n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))
            and not n.name.startswith("_") and n.name not in module.__all__]


def problems(module_name: str) -> list[str]:
    """Everything wrong with the public face of ``module_name``."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        return [f"{module_name} has no __all__"]
    found = [f"{module_name}.__all__ lists {n} twice" for n in sorted(set(names)) if names.count(n) > 1]
    for name in names:
        if name.startswith("_") and name != "__version__":
            found.append(f"{module_name}.__all__ exports the private name {name}")
        elif not hasattr(module, name):
            found.append(f"{module_name}.__all__ names {name}, which it does not have")
        elif inspect.ismodule(getattr(module, name)):
            found.append(f"{module_name}.__all__ exports the module {name}: import it as a module instead")
        else:
            where = defining_module(module, name)
            if not where.startswith("npddp"):
                found.append(f"{module_name}.{name} comes from {where}, outside the package")
            elif (why := undocumented(where, name)) is not None:
                found.append(why)
    found += [f"{module_name} defines {h} but does not export it: add it to __all__ or name it _{h}"
              for h in own_helpers(module)]
    return found


@pytest.mark.parametrize("module_name", PUBLIC)
def test_every_exported_name_exists_is_documented_and_no_helper_leaks(module_name):
    found = problems(module_name)
    assert not found, "\n".join(found)


def test_the_package_exports_what_a_training_script_imports():
    import npddp
    from npddp.comm import create
    from npddp.parallel.ddp import DistributedDataParallel
    from npddp.parallel.zero import ZeroRedundancyOptimizer

    assert (npddp.create, npddp.DistributedDataParallel, npddp.ZeroRedundancyOptimizer) == \
        (create, DistributedDataParallel, ZeroRedundancyOptimizer)
    assert {"create", "DistributedDataParallel", "save_checkpoint", "load_checkpoint"} <= set(npddp.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        npddp.nothing


def test_the_check_finds_a_leak_an_undocumented_name_and_a_missing_one(tmp_path, monkeypatch):
    package = tmp_path / "npddp_fake"
    package.mkdir()
    (package / "__init__.py").write_text(
        '"""A face."""\n\n__all__ = ["documented", "bare", "LIMIT", "missing"]\n\n'
        'LIMIT = 3\n\n\ndef documented():\n    """Says so."""\n\n\ndef bare():\n    return 1\n\n\n'
        'def helper_from_env():\n    """Internal."""\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "npddp_fake", raising=False)
    assert problems("npddp_fake") == [
        "npddp_fake.bare has no docstring",
        "npddp_fake.LIMIT has no '#:' comment above its assignment",
        "npddp_fake.__all__ names missing, which it does not have",
        "npddp_fake defines helper_from_env but does not export it: add it to __all__ or name it _helper_from_env",
    ]
