"""The run folder, kept safe: one run per folder (a pid lock), files written atomically, strict-JSON metrics,
checkpoints checked before they are trusted, and a resumed run held to the config it started with
(docs/engineering.md §4.3); and reading a run back (`read_metrics`, `run_metrics`) without torch or the trainer.

    <output_dir>/.lock               {"pid", "host"} of the run that owns the folder
    <output_dir>/config.yaml         the run's config
    <output_dir>/metrics.jsonl       one strict-JSON object per line (non-finite numbers -> null)
    <output_dir>/checkpoints/step_N  written as .step_N.tmp, renamed when complete
    <output_dir>/final/              the trained policy (written as .final.tmp, renamed)
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import socket
import struct
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from dppo.errors import ConfigError

if TYPE_CHECKING:
    from dppo.data import Problem

_HELD: set[str] = set()  # lock files this process holds


class RunError(RuntimeError):
    """A run that cannot go on, said in one line (the CLI prints it and exits 2)."""


class RunWarning(UserWarning):
    """Something a user should know about a run that still goes on (the CLI prints `dppo: warning: ...`)."""


def check_output_dir(output_dir: str) -> Path:
    """The run folder, refused when empty or unsafe (the current directory, home, a filesystem root: starting
    over deletes `checkpoints/` there), a file, or not writable. Creates it."""
    if not str(output_dir).strip():
        raise ConfigError("config field 'output_dir' must be a folder for this run, got ''")
    out = Path(output_dir).expanduser()
    resolved = out.resolve()
    if resolved in (Path.cwd().resolve(), Path.home().resolve()) or resolved == Path(resolved.anchor):
        raise ConfigError(f"config field 'output_dir' must be a folder of its own (not the current directory, "
                          f"home or /), got {str(output_dir)!r}")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"config field 'output_dir' {str(output_dir)!r} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"config field 'output_dir' {str(output_dir)!r} cannot be created: {e.strerror}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"config field 'output_dir' {str(output_dir)!r} is not writable")
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def acquire_lock(out: Path) -> Path:
    """Take `out/.lock` (created exclusively, holding this pid and host). A lock whose pid is dead on this host is
    stale and taken over; a live owner makes this run stop with one line."""
    path = out / ".lock"
    me = {"pid": os.getpid(), "host": socket.gethostname()}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = json.loads(path.read_text())
                pid, host = int(owner["pid"]), str(owner["host"])
            except (OSError, ValueError, KeyError, TypeError):  # half-written or foreign: treat as stale
                pid, host = -1, me["host"]
            held_here = str(path.resolve()) in _HELD
            if host != me["host"] or held_here or (pid != me["pid"] and pid > 0 and _alive(pid)):
                where = "this process" if held_here else f"pid {pid} on {host}"
                raise ConfigError(f"output_dir {str(out)!r} is in use by another run ({where}); wait for it, choose "
                                  f"another output_dir, or delete {str(path)!r} if that run is gone")
            warnings.warn(f"took over the lock of {str(out)!r} from pid {pid}, which is gone (a killed run)",
                          RunWarning, stacklevel=2)
            path.unlink(missing_ok=True)  # stale: its owner is dead
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        _HELD.add(str(path.resolve()))
        return path
    raise ConfigError(f"could not take the lock {str(path)!r} (another run keeps taking it)")


def release_lock(path: Path | None) -> None:
    if path is None:
        return
    _HELD.discard(str(path.resolve()))
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _no_space(error: BaseException, folder: Path, needed: int) -> bool:
    """Whether a failed write failed for lack of space: an OSError ENOSPC / EDQUOT anywhere in its chain, or another
    error (torch's serialiser says "unexpected pos" or "failed writing" on a full device) while `folder`'s device has
    less than `needed` bytes free."""
    seen, e = set(), error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_SPACE or "No space left" in str(e):
            return True
        e = e.__cause__ or e.__context__
    try:
        return shutil.disk_usage(folder).free < max(needed, 1)
    except OSError:
        return False


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e7 else f"{n / 1e3:.0f} KB"


@contextmanager
def space_for(folder: Path, what: str, needed: int = 0, partial: tuple[Path, ...] = (), then: str = ""):
    """A write of a run (a checkpoint, final weights, a metrics line, a table) into `folder`: if it fails for lack of
    space (`_no_space`), its partial temporary files (`partial`) go and it stops with one line — what, the folder, the
    bytes it needed (estimated) and those free, and `then` (what is left to resume from) — instead of a traceback
    from deep in torch; any other failure is raised as it is."""
    try:
        yield
    except Exception as e:
        if not _no_space(e, folder, needed):
            raise
        for path in partial:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        free = shutil.disk_usage(folder).free if folder.exists() else 0
        raise RunError(f"{what}: no space left on the device of {str(folder)!r} (it needed ~{_gb(needed)}, "
                       f"{_gb(free)} free){'; ' + then if then else ''}") from None


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename (never half-written; on a full
    disk, one line and no temporary file left)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with space_for(path.parent, f"writing {path.name}", len(text.encode()), (tmp,)):
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_line(record: dict) -> str:
    """One strict-JSON line (RFC 8259 has no NaN / Infinity: non-finite numbers become null)."""
    return json.dumps(_finite(record), allow_nan=False)


def append_line(path: Path, line: str) -> None:
    """Append `line` and a newline to `path` (created if missing) in one write(2) of the whole line on an O_APPEND
    descriptor, then fsync: a reader of a live run never sees half a line, and the line is on disk before the step
    goes on. A kill in the middle of the write can still cut a long line (Linux stops a write at a page boundary on
    SIGKILL); the readers drop a cut last line (`read_jsonl_prefix`, `trainer.read_metrics`)."""
    data = (line + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    size = os.fstat(fd).st_size
    try:
        with space_for(path.parent, f"appending to {path.name}", len(data)):
            try:
                done = os.write(fd, data)
                while done < len(data):  # a short write (a signal, a full disk): the rest, still appended
                    done += os.write(fd, data[done:])
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, size)  # no part of the line stays: the log is whole lines only
                raise
    finally:
        os.close(fd)


def read_jsonl_prefix(path: Path) -> list[str]:
    """The lines of a metrics file up to the first that is not a complete JSON object (a line cut by a kill), with a
    warning when it drops any."""
    lines, text = [], path.read_text(errors="replace").splitlines()
    for ln in text:
        try:
            json.loads(ln)
        except ValueError:
            warnings.warn(f"{str(path)!r}: dropped {len(text) - len(lines)} line(s) from line {len(lines) + 1} on, the "
                          f"first of them not a complete JSON object (cut by a kill while it was written)",
                          RunWarning, stacklevel=2)
            break
        lines.append(ln)
    return lines


def check_safetensors(path: Path) -> None:
    """Raise ValueError unless `path` is a complete safetensors file (header parses, data reaches the end)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path.name}: truncated")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise ValueError(f"{path.name}: truncated header")
        header = json.loads(f.read(n))
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        raise ValueError(f"{path.name}: {size} bytes, the header says {8 + n + end}")


def checkpoint_state(ckpt: Path) -> dict:
    """The trainer state of a checkpoint folder after checking its files; ValueError names what is broken."""
    try:
        state = json.loads((ckpt / "trainer_state.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"trainer_state.json unreadable ({type(e).__name__})") from None
    if not isinstance(state, dict) or "step" not in state:
        raise ValueError("trainer_state.json has no step")
    for f in ckpt.glob("*.safetensors"):
        check_safetensors(f)
    return state


def config_changes(saved: dict, current: dict, resumable: tuple[str, ...]) -> list[str]:
    """'field (saved -> current)' for each field that differs and may not change on resume (not in `resumable`:
    where and how often a run evaluates and saves, how far it goes, how it batches (the same rows and arithmetic up
    to float summation order) and memory knobs; `config.RESUMABLE_CHANGES`)."""
    out = []
    for name, value in current.items():
        if name in resumable or name not in saved:
            continue
        if saved[name] != value and not (isinstance(value, float) and isinstance(saved[name], (int, float))
                                         and math.isclose(saved[name], value, rel_tol=1e-12)):
            out.append(f"{name} ({saved[name]!r} -> {value!r})")
    return out


def data_fingerprint(problems: list[Problem]) -> str:
    """A short hash of the training problems (prompts and answers, in order)."""
    h = hashlib.sha256()
    for p in problems:
        h.update(p.prompt.encode() + b"\0" + p.answer.encode() + b"\1")
    return h.hexdigest()[:16]


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics.jsonl. A last line cut short (no newline, not JSON: a run killed while it appended
    the line) is dropped with a warning, as a resumed run drops it; any other unreadable line is an error."""
    text = Path(path).read_text(errors="replace")
    lines = text.splitlines()
    records = []
    for i, ln in enumerate(lines):
        if not ln.strip():
            continue
        try:
            records.append(json.loads(ln))
        except ValueError as e:
            if i == len(lines) - 1 and not text.endswith("\n"):
                warnings.warn(f"{str(path)!r}: dropped its last line, cut short after {len(ln)} characters (a run "
                              f"killed while writing it; resuming the run drops it too)", RunWarning, stacklevel=2)
                break
            raise ValueError(f"{str(path)!r} line {i + 1} is not a JSON object ({e})") from None
    return records


# Metrics of the machine, not of the run: two runs of one config and seed differ in these and agree on every other.
MACHINE_METRICS = ("timing_s/", "cpu_s/", "throughput/", "load/")


def run_metrics(record: dict) -> dict:
    """A metrics record without its machine metrics (`MACHINE_METRICS`)."""
    return {k: v for k, v in record.items() if not k.startswith(MACHINE_METRICS)}
