"""The package's layout is its architecture (DESIGN.md, "Package layout"): every module sits
in a wing, imports run from a higher wing to a lower one only, and there is no import circle,
not even one that only the type checker follows. Read from the source with `ast`, so the rule
holds for every import, those inside functions and under TYPE_CHECKING included."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "qwen3_asr_server"
ROOT = Path(__file__).resolve().parent.parent / "src" / PACKAGE
MAX_LINES = 350

# Higher imports lower; a wing never imports one of its own rank or above. A new wing or a new
# module at the root must be placed here first.
RANKS = {
    "__main__": 10,  # python -m qwen3_asr_server
    "cli": 9,  # the command line: parser, serve, transcribe, check, download
    "app": 8,  # create_app: lifespan, routers
    "api": 7,  # routers
    "outputs": 6,  # response bodies, subtitles, translation, speakers
    "streaming": 5,  # live sessions
    "transcription": 5,  # the upload pipeline
    "runtime": 4,  # scheduler, jobs, lifecycle, metrics
    "engines": 3,  # the models' code: the only wing that imports torch & co
    "audio": 2,  # decoding, PCM, G.711, voice detection, cutting
    "models": 2,  # which model, where it is, fallback and fetch
    "config": 1,  # Settings
    "seed_compat": 0,  # the seed's setting names (values only)
    "errors": 0,
    "logging": 0,
    "transcript": 0,  # Word, Segment, Transcript: what every wing passes
    "text": 0,  # language names, joining and splitting text
    "": 0,  # the package itself (__version__)
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports, wherever the import statement is."""
    found: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target not in known and "." in target:  # a name in a module: the module
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def wing(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def find_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One import circle as a path that ends where it starts; [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Imports from a wing to one of the same rank or higher (within a wing is fine)."""
    bad = []
    for source, targets in edges.items():
        for target in targets:
            a, b = wing(source), wing(target)
            if a != b and RANKS[a] <= RANKS[b]:
                bad.append(f"{source} -> {target}")
    return sorted(bad)


def test_every_module_is_in_a_ranked_wing() -> None:
    unplaced = sorted({wing(n) for n in modules()} - set(RANKS))
    assert unplaced == [], f"place these in RANKS (a wing, or a root module): {unplaced}"


def test_no_import_circle() -> None:
    assert find_cycle(graph()) == []


def test_imports_run_down_the_wings() -> None:
    assert upward(graph()) == []


def test_engines_import_nothing_above_them() -> None:
    above = {"runtime", "api", "cli", "app", "transcription", "streaming", "outputs"}
    edges = graph()
    bad = [
        (s, t) for s, ts in edges.items() if wing(s) == "engines" for t in ts if wing(t) in above
    ]
    assert bad == []


def test_modules_stay_small() -> None:
    long = {n: len(p.read_text().splitlines()) for n, p in modules().items()}
    assert {n: c for n, c in long.items() if c > MAX_LINES} == {}


def test_the_checks_see_a_circle_and_an_upward_import() -> None:
    """The checker itself, on made-up graphs: a circle through a TYPE_CHECKING-only import
    counts as one, and an engine that imports the scheduler is an upward import."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []
    made_up = {f"{PACKAGE}.engines.qwen": {f"{PACKAGE}.runtime.scheduler"}}
    assert upward(made_up) == [f"{PACKAGE}.engines.qwen -> {PACKAGE}.runtime.scheduler"]
    assert upward({f"{PACKAGE}.runtime.scheduler": {f"{PACKAGE}.engines.base"}}) == []


def test_imports_under_type_checking_and_in_functions_are_read(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .config import Settings\n"
        "def f() -> None:\n"
        "    from .audio import g711\n"
    )
    known = {PACKAGE, f"{PACKAGE}.config", f"{PACKAGE}.audio", f"{PACKAGE}.audio.g711"}
    found = imports(f"{PACKAGE}.mod", source, known)
    assert found == {f"{PACKAGE}.config", f"{PACKAGE}.audio.g711"}


def test_engines_group_their_modules_in_packages() -> None:
    """A family of engine modules is a package (engines/qwen/, engines/whisper/,
    engines/remote/, engines/speakers/), not a name prefix at the top of engines/: only the
    shared protocol, the registry and the wrappers stay there."""
    top = sorted(p.stem for p in (ROOT / "engines").glob("*.py"))
    prefixed = [n for n in top if n.split("_")[0] in ("qwen", "whisper", "remote", "diarize")]
    assert prefixed == []
    assert {"fbank", "diarizing", "word_times"}.isdisjoint(top)
    for package in ("qwen", "whisper", "remote", "speakers"):
        assert (ROOT / "engines" / package / "__init__.py").exists()


PROTOCOLS = ("openai", "seed", "deepgram")  # api/<protocol>/; api/live/ is what they share


def api_package(name: str) -> str:
    """`openai`, `seed`, `deepgram` or `live` for a module of api/'s packages; "" otherwise."""
    parts = name.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "api" else ""


def test_api_is_one_package_per_protocol() -> None:
    """Issue 58 §5: api/ by protocol. A protocol's modules live in its package (no `ws_`,
    `realtime_` or `seed_` prefixes at the top of api/), a protocol never imports another
    protocol's package, and `live/` (what every WebSocket route shares) imports none."""
    top = sorted(p.stem for p in (ROOT / "api").glob("*.py"))
    assert [n for n in top if n.startswith(("ws_", "realtime", "seed_", "live_"))] == []
    bad = []
    for source, targets in graph().items():
        for target in targets:
            a, b = api_package(source), api_package(target)
            if b in PROTOCOLS and a != b and a in (*PROTOCOLS, "live"):
                bad.append(f"{source} -> {target}")
    assert bad == []
