"""The datasets of a watched folder of specs (several datasets, one Dagster run per dataset).

A folder holds dataset specs (`*.yaml` / `*.yml`, at its top or one folder down, e.g.
`datasets/companies/companies.yaml` beside its table). Each valid spec is a dataset; its
fingerprint changes when the spec or its table changes (size or modification time), which is how
the nightly schedule tells new records apart from a table it has already enriched. Nothing here
imports Dagster.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from enrich_crawl.dataset.spec import DatasetSpec, SpecError, load_spec

SPEC_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class WatchedSpec:
    name: str
    path: Path
    fingerprint: str
    spec: DatasetSpec


@dataclass(frozen=True)
class SpecProblem:
    path: Path
    reason: str

    @property
    def key(self) -> str:
        return f"{self.path}:{hashlib.sha256(self.reason.encode()).hexdigest()[:12]}"


def fingerprint(spec: DatasetSpec) -> str:
    """Changes when the spec file or its table changes (content of the spec, size and mtime of the
    table: hashing a table of millions of rows at every sensor tick would cost too much)."""
    digest = hashlib.sha256()
    digest.update(spec.path.read_bytes())
    try:
        stat = spec.source.stat()
        digest.update(f"{spec.source}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    except OSError:
        digest.update(f"{spec.source}:absent".encode())
    return digest.hexdigest()


def candidate_files(folder: Path) -> list[Path]:
    files = [
        p
        for pattern in ("*", "*/*")
        for p in folder.glob(pattern)
        if p.suffix.lower() in SPEC_SUFFIXES and p.is_file() and not p.name.startswith(".")
    ]
    return sorted(set(files))


def scan_specs(folder: Path) -> tuple[list[WatchedSpec], list[SpecProblem]]:
    """The valid specs of `folder` (by dataset name) and the files that could not be used."""
    specs: dict[str, WatchedSpec] = {}
    problems: list[SpecProblem] = []
    for path in candidate_files(folder):
        try:
            spec = load_spec(path)
        except SpecError as exc:
            problems.append(SpecProblem(path, str(exc)))
            continue
        except (OSError, ValueError) as exc:
            problems.append(SpecProblem(path, f"{path}: {exc}"))
            continue
        if not spec.source.is_file():
            problems.append(SpecProblem(path, f"{path}: source: no such file {spec.source}"))
            continue
        if spec.name in specs:
            problems.append(
                SpecProblem(
                    path,
                    f"{path}: name: dataset {spec.name!r} is already defined by "
                    f"{specs[spec.name].path}",
                )
            )
            continue
        specs[spec.name] = WatchedSpec(spec.name, spec.path, fingerprint(spec), spec)
    return sorted(specs.values(), key=lambda s: s.name), problems


def find_spec(folder: Path, name: str) -> WatchedSpec | None:
    specs, _ = scan_specs(folder)
    return next((s for s in specs if s.name == name), None)
