"""Routes only read: no API module imports the engine or the analysis loop.

The pass (jobs/loop.py) analyses and stores; the API serves what it stored, and hands any other
window to jobs/windows.py, which runs it in the analysis workers. An API module that imported
the engine (smon_server.whatif) or the loop (leases, the pass) could run either on a request's
time again. The import graph is read with grimp (import-linter's engine), function-local imports
included.
"""

from __future__ import annotations

import grimp
import pytest

ENGINE = "smon_server.whatif"
LOOP = "smon_server.jobs.loop"
ROOT = ("smon_server.context", "smon_server.runtime", "smon_server.cli")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("smon_server", include_external_packages=False, cache_dir=None)


def _api_modules(graph: grimp.ImportGraph) -> list[str]:
    return sorted(graph.find_descendants("smon_server.api") | {"smon_server.api"})


def _is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_api_module_imports_the_engine_or_the_loop(graph: grimp.ImportGraph) -> None:
    found = {
        (module, imported)
        for module in _api_modules(graph)
        for imported in graph.find_modules_directly_imported_by(module)
        if _is_under(imported, ENGINE) or _is_under(imported, LOOP)
    }
    assert not found, f"API modules importing the engine or the analysis loop: {sorted(found)}"


def test_no_api_module_reaches_the_loop_at_all(graph: grimp.ImportGraph) -> None:
    """Not even through another module: the loop (leases, passes) is the composition root's."""
    chains = {
        module: graph.find_shortest_chain(importer=module, imported=LOOP) for module in _api_modules(graph)
    }
    assert not {m: c for m, c in chains.items() if c}, chains


def test_the_loop_and_the_api_do_not_import_the_composition_root(graph: grimp.ImportGraph) -> None:
    """context.py builds the workers and the window service; what it builds must not import it."""
    below = [*_api_modules(graph), *sorted(graph.find_descendants("smon_server.jobs"))]
    found = {
        (module, imported)
        for module in below
        for imported in graph.find_modules_directly_imported_by(module)
        if imported in ROOT
    }
    assert not found, sorted(found)


def test_analysis_and_its_workers_form_no_cycle(graph: grimp.ImportGraph) -> None:
    """The worker entry point runs the analysis; the analysis does not import the workers."""
    assert (
        graph.find_shortest_chain(importer="smon_server.jobs.analysis", imported="smon_server.jobs.workers")
        is None
    )
    assert (
        graph.find_shortest_chain(importer="smon_server.jobs.failures", imported="smon_server.jobs.workers")
        is None
    )
