"""The user-facing configuration error and its hints, in a module of its own so that reading a run folder
(`dppo.runfiles`, `dppo.results`) needs neither torch nor the config's registries."""

from pathlib import Path


class ConfigError(ValueError):
    """A one-line, user-facing configuration error."""


class MissingDependency(ImportError):
    """A package a run needs cannot be imported: one line naming it and the command that installs it (never a
    silent fallback: a reward whose checker is missing would score every answer 0)."""


def hub_hint(value: str, lead: str = "; ") -> str:
    """"; a hub id is written hf:<id>" when `value` looks like one (org/name, not a data file's name), else ""."""
    looks_like_hub = value.count("/") == 1 and not value.startswith((".", "/")) and \
        Path(value).suffix not in (".jsonl", ".json", ".parquet", ".csv", ".txt")  # a version like Qwen3-0.6B is not a file
    return f"{lead}a hub id is written hf:{value}" if looks_like_hub else ""
