"""Every command the README and docs/ tell a reader to run names the environment it runs in (`.venv/bin/`,
`.venv-vllm/bin/`, `.venv-gpu/bin/`, or a script that makes and picks one), GPU commands name `.venv-gpu` (the only
environment with vLLM and flash-attn), and each one's program answers `--help` (the main environment's, run here;
`.venv-vllm`'s in tests/test_vllm.py; `.venv-gpu`'s is the same code, so its module and files are checked)."""

import contextlib
import io
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("python", "python3", "dppo", "accelerate", "torchrun", "papermill")
WRAPPERS = ("./reproduce.sh", "./run_tests.sh", "bash scripts/bootstrap.sh", "bash bench/gpu_check.sh")
ENVIRONMENTS = (".venv/bin/", ".venv-vllm/bin/", ".venv-gpu/bin/")


def documented_commands() -> list[tuple[str, str]]:
    """(file, command) for every line of a shell code block and every inline code span that runs a program with a
    path or module argument (`accelerate launch` as a name in prose is not a command)."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].strip()
                if line and not line.startswith("#"):
                    found.append((path.name, line))
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for span in re.findall(r"`([^`]+)`", " ".join(prose.split())):
            words = span.split()
            program = words[0].rsplit("/bin/", 1)[-1] if words else ""
            if program in PROGRAMS and any("/" in w or w == "-m" for w in words[1:]):
                found.append((path.name, span))
    return [(f, c) for f, c in found if c.split()[0].rsplit("/bin/", 1)[-1] in PROGRAMS or c.startswith(WRAPPERS)]


COMMANDS = documented_commands()


def test_every_documented_command_names_its_environment_and_gpu_ones_the_gpu_environment():
    assert len(COMMANDS) > 20
    unnamed = [(f, c) for f, c in COMMANDS if not c.startswith(WRAPPERS + ENVIRONMENTS)]
    assert not unnamed, unnamed
    gpu = [(f, c) for f, c in COMMANDS if re.search(r"accelerate launch|--check-gpu|experiments/paper/", c)
           and not c.startswith(WRAPPERS)]
    assert gpu and all(c.startswith(".venv-gpu/bin/") for _, c in gpu), gpu
    made = (ROOT / "scripts/bootstrap.sh").read_text()
    for env in {c.split("/bin/")[0] for _, c in COMMANDS if c.startswith(ENVIRONMENTS)}:
        assert f':-{env}}}"' in made, f"bootstrap.sh never makes {env}"  # VENV="${DPPO_..._VENV:-<env>}"


def _help(argv: list[str]) -> str:
    """Run `argv --help` in this process (python SCRIPT / python -m MODULE / dppo SUBCOMMAND): its help text; it must
    exit with status 0."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done, pytest.MonkeyPatch.context() as mp:
        if argv[0] == "dppo":
            from dppo.cli import main

            sys.exit(main([argv[1], "--help"]))
        if argv[1] == "-m":
            mp.setattr(sys, "argv", [argv[2], "--help"])
            runpy.run_module(argv[2], run_name="__main__")
        mp.setattr(sys, "argv", [argv[1], "--help"])
        mp.syspath_prepend(str((ROOT / argv[1]).parent))  # as `python SCRIPT` puts the script's folder first
        runpy.run_path(str(ROOT / argv[1]), run_name="__main__")
    assert done.value.code in (0, None), argv
    return out.getvalue()


def _program(command: str) -> tuple[str, ...]:
    """What answers --help for a command: ('dppo', subcommand), ('python', '-m', module) or ('python', script)."""
    words = shlex.split(command.split("/bin/", 1)[1])
    if words[0] == "dppo":
        return ("dppo", words[1])
    if words[0] == "accelerate":  # accelerate launch [...] -m MODULE SUBCOMMAND: the module's subcommand
        module = words[words.index("-m") + 1]
        return ("dppo", words[words.index("-m") + 2]) if module == "dppo.cli" else ("python", "-m", module)
    return ("python", *words[1:3]) if words[1] == "-m" else ("python", words[1])


NOT_A_CLI = {("python", "-m", "dppo.readme"), ("python", "-m", "dppo.reference")}  # rewrite README.md / docs/reference.md
# when run; their tests are tests/test_readme.py and tests/test_reference.py


@pytest.mark.parametrize("program", sorted({_program(c) for _, c in COMMANDS
                                            if c.startswith((".venv/bin/", ".venv-gpu/bin/"))} - NOT_A_CLI))
def test_each_documented_program_answers_help(program):
    """Scripts and modules documented for .venv (run there) and .venv-gpu (the same code) parse `--help`; the files a
    documented command names exist."""
    assert _help(list(program)).strip(), program


def test_files_named_by_documented_commands_exist():
    for f, command in COMMANDS:
        for word in shlex.split(command.replace("<", "").replace(">", "")):
            if re.fullmatch(r"(experiments|bench|scripts|notebooks)/[\w./-]+\.(yaml|py|sh|ipynb)", word):
                assert (ROOT / word).is_file(), (f, command, word)
