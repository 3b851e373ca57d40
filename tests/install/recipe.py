"""The image's recipe as the Dockerfile writes it, for the tests that follow it without a container
engine: what the wheel's build stage copies, how it builds the wheel, which extra the final stage
installs it with, and what the image runs."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Stage:
    name: str
    instructions: tuple[tuple[str, str], ...]  # (INSTRUCTION, arguments), continuation lines joined

    def all(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]


@dataclass(frozen=True)
class ImageRecipe:
    sources: tuple[str, ...]  # repository paths the build stage copies, each to the same place
    built: tuple[tuple[str, str], ...]  # (stage, path) the build stage takes from another stage
    wheel_options: tuple[str, ...]  # `pip wheel` options, --wheel-dir left out
    extra: str  # the final stage installs the wheel with this extra
    entrypoint: tuple[str, ...]


def stages(dockerfile: str) -> list[Stage]:
    text = re.sub(r"\\\n", " ", dockerfile)
    out: list[Stage] = []
    current: list[tuple[str, str]] = []
    name = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            if current or name:
                out.append(Stage(name, tuple(current)))
            match = re.search(r"\bAS\s+(\S+)$", args, flags=re.I)
            name, current = (match.group(1) if match else ""), []
        current.append((instruction, args.strip()))
    out.append(Stage(name, tuple(current)))
    return out


def read(path: Path) -> ImageRecipe:
    """The recipe of `path`; an AssertionError says which step it could not find."""
    all_stages = stages(path.read_text())
    [build] = [s for s in all_stages if any(" wheel " in f" {run} " for run in s.all("RUN"))]
    sources: list[str] = []
    built: list[tuple[str, str]] = []
    for args in build.all("COPY"):
        words = args.split()
        if words[0].startswith("--from="):
            stage, source, target = words[0].removeprefix("--from="), words[1], words[2]
            assert source.endswith(target.removeprefix(".")), f"COPY {args}: copied to another place"
            built.append((stage, target.removeprefix("./")))
            continue
        *paths, target = words
        for source in paths:
            assert target in ("./", f"./{source}"), f"COPY {args}: {source} copied to another place"
            sources.append(source)
    [wheel_run] = [r for r in build.all("RUN") if "pip wheel" in r]
    words = shlex.split(wheel_run)
    options = words[words.index("wheel") + 1 :]
    assert options[-1] == ".", f"RUN {wheel_run}: builds something other than the project"
    at = options.index("--wheel-dir")
    options = options[:at] + options[at + 2 : -1]
    final = all_stages[-1]
    [install] = [r for r in final.all("RUN") if "pip install" in r]
    extra = re.search(r"smon-\*\.whl\)\[([\w,-]+)\]", install)
    assert extra, f"RUN {install}: does not install the built wheel with an extra"
    [entrypoint] = final.all("ENTRYPOINT")
    return ImageRecipe(
        sources=tuple(sources),
        built=tuple(built),
        wheel_options=tuple(options),
        extra=extra.group(1),
        entrypoint=tuple(json.loads(entrypoint)),
    )
