"""An export directory's own files: `speedgpt export` lists what it wrote in a manifest, so a later
export into the same directory replaces exactly those files and nothing else.

    OUT/.speedgpt-export.json   {"format": "speedgpt", "files": ["config.json", "model.safetensors"],
                                 "complete": true, "source": "/abs/path/of/the/run"}

Any exporter (one per `--format`) writes its files through `export_files(out, fmt)`:

    check_export_dir(out, source)                 # up front, before the expensive work: refuse a foreign folder
    with export_files(out, "hf", source) as tmp:  # fill tmp; on a clean exit the files move into out
        ...

Rules, so a user's files are never lost or mixed with ours:
- a missing or empty `out` is fine; so is one holding a previous export (its manifest, or a speedgpt
  export made before manifests existed: a config.json with speedgpt's `format_version` and `export`);
- any other non-empty folder is refused: it is somebody else's (a Hugging Face checkout, notes, ...);
- so is an export of another run (or export): replacing it would lose that export without a word. The
  manifest records the source's absolute path; older exports, the `source` their config.json records;
- a path under a file (`--out notes.txt/sub`) is refused up front, naming the file (outdir.py);
- files in `out` that the previous export did not write (a README.md added by hand) stay; an export
  that would overwrite one of them is refused instead;
- the previous export's files that the new one does not write again are removed.

Each file is written in a temporary sibling directory, fsynced and renamed into place. The manifest
says `"complete": false` while files are being swapped (listing the old and the new ones, so a
re-export after a crash still knows every file it owns), and readers refuse such an export.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from ..atomic import atomic_write, fsync_dir, seal_files, staging_dir

MANIFEST = ".speedgpt-export.json"
# What a speedgpt export wrote before it kept a manifest (rundir/weights.py's names).
_LEGACY_FILES = ("config.json", "model.safetensors")


class ExportError(RuntimeError):
    """The export cannot be written where asked; the message says what to do."""


def read_manifest(out: str | os.PathLike) -> dict | None:
    """The manifest of the export in `out`, or None when it has none (not an export, or an old one)."""
    try:
        data = json.loads((Path(out) / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        data = None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) and _inside(f) for f in files):
        raise ExportError(f"{Path(out) / MANIFEST} is unreadable; it lists the files a speedgpt export wrote: "
                          f"remove the export's files and it by hand, or choose another --out directory")
    return data


def _inside(name: str) -> bool:
    """A manifest entry names a file inside the export directory, nothing above or beside it."""
    path = Path(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts


def _legacy_export_files(out: Path) -> list[str] | None:
    """The files of a speedgpt export written before manifests existed, or None when `out` holds none."""
    try:
        meta = json.loads((out / _LEGACY_FILES[0]).read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(meta, dict) and "format_version" in meta and isinstance(meta.get("export"), dict)):
        return None  # e.g. a Hugging Face config.json: not ours
    return [name for name in _LEGACY_FILES if (out / name).is_file()]


def _recorded_source(out: Path, manifest: dict | None) -> str | None:
    """The run (or export) the export in `out` was made from: its manifest's absolute path, else (an export
    from before manifests recorded it) the `source` in its config.json, speedgpt's or a Hugging Face
    folder's; None when neither says."""
    if manifest is not None and isinstance(manifest.get("source"), str):
        return manifest["source"]
    try:
        meta = json.loads((out / _LEGACY_FILES[0]).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    export = meta.get("export")
    if export is None and isinstance(meta.get("speedgpt"), dict):  # a Hugging Face folder keeps it there
        export = meta["speedgpt"].get("export")
    source = export.get("source") if isinstance(export, dict) else None
    return source if isinstance(source, str) else None


def _check_same_source(out: Path, manifest: dict | None, source: str | os.PathLike | None) -> None:
    """ExportError when `out` holds the export of another source than `source` (None: not checked)."""
    if source is None or Path(out).resolve().is_relative_to(Path(source).resolve()):
        return  # an export inside its own run (RUN/export): a copied or moved run re-exports into its own folder
    recorded = _recorded_source(out, manifest)
    if recorded is not None and not _same_source(recorded, source):
        raise ExportError(f"--out {out} holds the export of {recorded}, not of {source}; choose another --out, "
                          f"or remove {out} first to replace it (nothing was changed)")


def _same_source(recorded: str, source: str | os.PathLike) -> bool:
    """Whether the recorded source names `source`. Exports before manifests recorded an absolute path wrote it as
    typed, relative to a directory nobody noted: such a path names `source` when it ends `source`'s path ("runs/y"
    and /tmp/w/runs/y; resolved against today's directory it refused the same run's re-export from elsewhere)."""
    now, before = Path(source).resolve(), Path(recorded)
    if before.is_absolute():
        return before.resolve() == now
    parts = [part for part in before.parts if part != "."]
    if ".." in parts or not parts:
        return True  # cannot tell which directory it went up from: not refused
    return list(now.parts[-len(parts):]) == parts


def is_export_dir(out: str | os.PathLike) -> bool:
    """Whether `out` holds a speedgpt export (either format; one made before manifests, too)."""
    out = Path(out)
    return (out / MANIFEST).is_file() or _legacy_export_files(out) is not None


def check_export_dir(out: str | os.PathLike, source: str | os.PathLike | None = None) -> list[str]:
    """The files a previous export wrote in `out` (relative paths; [] for a missing or empty directory).
    ExportError naming --out when `out` is a file, lies under one, is a non-empty directory no speedgpt
    export wrote, or (with `source`) holds the export of another source."""
    from ..outdir import OutDirError, check_out_dir

    out = Path(out)
    if not out.exists() or out.is_dir():
        try:  # a file on the way ("--out notes.txt/sub") is named now, not met as "[Errno 17] File exists"; and a
            check_out_dir(out)  # folder in a run's checkpoints, which training prunes, existing or not
        except OutDirError as e:
            raise ExportError(str(e)) from None
    if not out.exists():
        return []
    if not out.is_dir():
        raise ExportError(f"--out {out} is a file; choose an empty or new --out directory")
    manifest = read_manifest(out)
    if manifest is not None:
        _check_same_source(out, manifest, source)
        return [str(f) for f in manifest["files"]]
    owned = _legacy_export_files(out)
    if owned is not None:
        _check_same_source(out, None, source)
        return owned
    if any(out.iterdir()):
        raise ExportError(f"--out {out} holds files that no speedgpt export wrote; choose an empty or new "
                          f"--out directory (nothing was changed)")
    return []


def written_files(out: str | os.PathLike) -> list[Path]:
    """The files the export in `out` consists of (its manifest's list)."""
    return [Path(out) / f for f in check_export_dir(out)]


def _write_manifest(out: Path, fmt: str, files: list[str], complete: bool, source: str | None) -> None:
    data = {"format": fmt, "files": sorted(files), "complete": complete}
    if source is not None:
        data["source"] = source
    atomic_write(out / MANIFEST, json.dumps(data, indent=1) + "\n")


@contextlib.contextmanager
def export_files(out: str | os.PathLike, fmt: str, source: str | os.PathLike | None = None) -> Iterator[Path]:
    """Yield an empty temporary directory for an exporter of format `fmt` to fill. On a clean exit its
    files (any subfolders kept) replace the previous export's files in `out` and the manifest lists
    them, and the absolute path of `source` (the run or export they come from); on an exception nothing
    in `out` changes. See the module docstring for the rules."""
    out = Path(out)
    recorded = None if source is None else str(Path(source).resolve())
    check_export_dir(out, source)  # refuse early, before the caller's expensive writes
    with staging_dir(out.resolve()) as tmp:  # beside the real directory (out may be a link): one file system
        yield tmp
        new = [f.relative_to(tmp).as_posix() for f in seal_files(tmp)]
        old = check_export_dir(out, source)  # again: the folder may have changed while the files were written
        foreign = [f for f in new if f not in old and (out / f).exists()]
        if foreign:
            raise ExportError(f"--out {out} holds {foreign[0]}, which no speedgpt export wrote and this one "
                              f"would replace; move it, or choose an empty or new --out directory")
        out.mkdir(parents=True, exist_ok=True)
        _write_manifest(out, fmt, sorted(set(old) | set(new)), complete=False, source=recorded)
        for name in new:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / name, out / name)
        for name in set(old) - set(new):
            (out / name).unlink(missing_ok=True)
        fsync_dir(out)
        _write_manifest(out, fmt, new, complete=True, source=recorded)
