"""Every command quoted in the docs must exist and its flags must parse.

Scanned: README.md, docs/*.md, setup/*.md, version*/README.md and exercises/**/*.md -
fenced bash/sh/console blocks and inline `code` that starts with a command. For each
command that invokes something in this repository:

  python <script.py> ... / python -m <module> ...   the file/module exists; its flags parse:
      scripts that go through training.main (every version, every debugging stage) are
      parsed exactly - training.main is replaced by "build the parser, parse, validate",
      so nothing trains; any other script runs with --help and each long flag quoted
      must appear in its help text
  bash <script.sh> / ./<script.sh>                  the file exists and `bash -n` accepts it
  make <target>                                     the Makefile has the target
  torchrun ... <script.py> ..., rocprofv3/ncu/... -- python <script.py> ...: the python part

Everything runs in this process (torch is imported once), so the test stays fast.
"""
from __future__ import annotations

import contextlib
import io
import re
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from conftest import REPO

import harness
import training
from harness.spec import VersionSpec
from training import cli

DOC_GLOBS = ["README.md", "docs/*.md", "setup/*.md", "version*/README.md", "exercises/**/*.md"]
SHELL_LANGS = {"", "bash", "sh", "shell", "console", "zsh"}
PYTHONS = {"python", "python3", ".venv/bin/python", "$PY", "${PY}", "$(which python)"}
WRAPPERS = {"sudo", "env", "time", "nohup", "exec"}
COMMAND_STARTS = ("python ", "python3 ", "bash ", "./", "make ", "torchrun ", "sh ")


@dataclass(frozen=True)
class Quoted:
    doc: str
    line: int
    text: str


# ------------------------------------------------------------------ extraction
def doc_files() -> list[Path]:
    files = {p for pattern in DOC_GLOBS for p in REPO.glob(pattern)}
    return sorted(p for p in files if ".venv" not in p.parts)


def quoted_commands(path: Path) -> list[Quoted]:
    doc = str(path.relative_to(REPO))
    lines = path.read_text().splitlines()
    found, fence, pending, start = [], None, "", 0
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip().lower()
            continue
        if fence is not None:
            if fence not in SHELL_LANGS:
                continue
            text = stripped[2:] if stripped.startswith("$ ") else stripped
            if not pending:
                start = number
            if text.endswith("\\"):
                pending += text[:-1] + " "
                continue
            text, pending = pending + text, ""
            if text and not text.startswith("#"):
                found.append(Quoted(doc, start, text))
        else:  # inline spans in prose
            for span in re.findall(r"`([^`]+)`", line):
                if span.startswith(COMMAND_STARTS) or re.match(r"^[A-Z_]+=\S+ (python|bash)", span):
                    found.append(Quoted(doc, number, span))
    return found


def simple_commands(text: str) -> list[list[str]]:
    """Split a shell line at && || ; | into token lists; drop comments and env assignments."""
    text = text.replace("$(which python)", "python")
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: prose, not a command
        return []
    commands, current = [], []
    for token in tokens:
        if token and set(token) <= set(";&|"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    cleaned = []
    for cmd in commands:
        while cmd and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", cmd[0]) or cmd[0] in WRAPPERS):
            cmd = cmd[1:]
        if cmd:
            cleaned.append(cmd)
    return cleaned


def is_placeholder(token: str) -> bool:
    return any(mark in token for mark in ("<", ">", "...", "…", "*", "$"))


def repo_path(token: str, cwd: Path = REPO) -> Path | None:
    """A relative path into this repository (existing or not), else None."""
    if token.startswith(("/", "~", "-")) or is_placeholder(token):
        return None
    path = cwd / token.removeprefix("./")
    top = Path(token.removeprefix("./")).parts[0] if token.strip("./") else ""
    explicit = token.startswith("./") and token.endswith((".py", ".sh"))
    if path.exists() or explicit or (top and (cwd / top).exists()):
        return path
    return None


# ------------------------------------------------------------------ checking
class HarnessParsed(Exception):
    """Raised by the stand-in for training.main once the flags have parsed."""


def parse_only(version, build_model, *, description="", add_arguments=None, model_options=None,
               preflight=None, init_from_v1=True, default_optimizer="default", interpreted=False, argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if isinstance(version, VersionSpec):  # a version's SPEC, as training.main takes it
        version, add_arguments = version.name, version.add_arguments
    parser = cli.build_parser(version, description, add_arguments, default_optimizer)
    args = parser.parse_args(argv)  # UsageError on a bad flag; --help exits
    cli.settings_from_args(version, args, argv, interpreted)  # value checks (seq-len <= max_seq_len, ...)
    raise HarnessParsed(version)


class PythonRunner:
    """Runs repo scripts in this process with training.main replaced by parse_only."""

    def __init__(self):
        self.help_cache: dict = {}

    def run(self, target: tuple[str, str], argv: list[str]):
        """-> (exit code, output, went_through_harness)."""
        kind, name = target
        out = io.StringIO()
        old_argv, old_path = sys.argv, list(sys.path)
        sys.argv = [name, *argv]
        if kind == "script":
            sys.path.insert(0, str(Path(name).parent))
        code, via_harness = 0, False
        try:
            with mock.patch.object(training, "main", parse_only), \
                    contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                if kind == "script":
                    runpy.run_path(name, run_name="__main__")
                else:
                    runpy.run_module(name, run_name="__main__", alter_sys=True)
        except HarnessParsed:
            via_harness = True
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            via_harness = via_harness or "model size (override the preset)" in out.getvalue()
        except harness.UsageError as e:
            code, via_harness = 2, True
            out.write(str(e))
        finally:
            sys.argv, sys.path[:] = old_argv, old_path
        return code, out.getvalue(), via_harness

    def help_text(self, target, positionals):
        key = (target, tuple(positionals))
        if key not in self.help_cache:
            self.help_cache[key] = self.run(target, [*positionals, "--help"])
        return self.help_cache[key]


def check_python(target, argv, runner: PythonRunner) -> str | None:
    kind, name = target
    if kind == "script" and not Path(name).exists():
        return f"{Path(name).relative_to(REPO)} does not exist"
    code, text, via_harness = runner.help_text(target, [])
    if code != 0:
        return f"--help failed (exit {code}): {text.strip().splitlines()[-1:] if text.strip() else ''}"
    if any(is_placeholder(a) for a in argv):
        argv = [a for a in argv if not is_placeholder(a)]
        if via_harness:  # a placeholder stood for a value: check flag names only
            return check_flags_in_help(argv, text)
    if via_harness:
        code, text, _ = runner.run(target, argv)
        return None if code == 0 else f"flags do not parse: {text.strip().splitlines()[-1]}"
    positionals = []
    for a in argv:  # leading positionals may be sub-commands with their own flags
        if a.startswith("-"):
            break
        positionals.append(a)
    if positionals:
        code, sub_text, _ = runner.help_text(target, positionals)
        if code == 0:
            text = sub_text
    return check_flags_in_help(argv, text)


def check_flags_in_help(argv, help_text) -> str | None:
    flags = {a.split("=")[0] for a in argv if a.startswith("--") and a != "--"}
    missing = sorted(f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", help_text))
    return f"flags not in --help: {', '.join(missing)}" if missing else None


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, flags=re.M))


def check_line(text: str, runner: PythonRunner) -> list[str]:
    """Problems of one quoted line; `cd DIR && ...` moves where later paths are looked up."""
    problems, cwd = [], REPO
    for tokens in simple_commands(text):
        if tokens[0] == "cd" and len(tokens) > 1 and not is_placeholder(tokens[1]):
            cwd = (cwd / tokens[1]).resolve()
            continue
        problem = check_command(tokens, runner, cwd)
        if problem:
            problems.append(problem)
    return problems


def check_command(tokens: list[str], runner: PythonRunner, cwd: Path = REPO) -> str | None:
    """None when fine or not about this repository; else what is wrong."""
    head = tokens[0]
    if head == "make":
        targets = [t for t in tokens[1:] if "=" not in t and not t.startswith("-")]
        unknown = [t for t in targets if t not in makefile_targets()]
        return f"no Makefile target {', '.join(unknown)}" if unknown else None
    if head in ("bash", "sh") or (head.startswith("./") and head.endswith(".sh")):
        script = tokens[1] if head in ("bash", "sh") and len(tokens) > 1 else head
        path = repo_path(script, cwd)
        if path is None or not script.endswith(".sh"):
            return None
        if not path.exists():
            return f"{script} does not exist"
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        return None if proc.returncode == 0 else f"bash -n {script}: {proc.stderr.strip()}"
    # python (possibly behind torchrun, a profiler, ...): find the python part
    for i, token in enumerate(tokens):
        if token in PYTHONS or re.fullmatch(r"(.*/)?python3?(\.\d+)?", token):
            rest = tokens[i + 1:]
            if rest[:1] == ["-m"] and len(rest) > 1:
                module = rest[1]
                if module.split(".")[0] not in top_level_packages():
                    return None
                return check_python(("module", module), rest[2:], runner)
            if rest and rest[0].endswith(".py"):
                path = repo_path(rest[0], cwd)
                return None if path is None else check_python(("script", str(path)), rest[1:], runner)
            return None
        if head == "torchrun" and token.endswith(".py"):
            path = repo_path(token, cwd)
            return None if path is None else check_python(("script", str(path)), tokens[i + 1:], runner)
    if head.endswith(".py") and repo_path(head, cwd):  # ./script.py
        return check_python(("script", str(repo_path(head, cwd))), tokens[1:], runner)
    return None


def top_level_packages() -> set[str]:
    return {p.name for p in REPO.iterdir() if (p / "__init__.py").exists()}


# ------------------------------------------------------------------ tests
def all_quoted() -> list[Quoted]:
    return [q for path in doc_files() for q in quoted_commands(path)]


def test_docs_quote_commands():
    quoted = all_quoted()
    assert len(quoted) > 20, "the scanner found almost no commands: is the extraction broken?"
    assert any("tiny_llama_v1.py" in q.text for q in quoted)


def test_every_quoted_command_exists_and_parses():
    runner, failures, checked = PythonRunner(), [], 0
    for quoted in all_quoted():
        checked += 1
        for problem in check_line(quoted.text, runner):
            failures.append(f"{quoted.doc}:{quoted.line}: `{quoted.text}`: {problem}")
    assert checked
    assert not failures, "\n".join(failures)


def test_every_quoted_torchrun_is_standalone():
    """Without --standalone (or a rendezvous of its own) torchrun waits on a fixed port that
    another job on the machine may hold."""
    quoted = [(q, cmd) for q in all_quoted() for cmd in simple_commands(q.text)
              if cmd and cmd[0] == "torchrun"]
    assert quoted
    bare = [f"{q.doc}:{q.line}" for q, cmd in quoted
            if not {"--standalone", "--rdzv-endpoint", "--rdzv_endpoint", "--master-port"} & set(cmd)]
    assert not bare, bare


def test_version_readme_diffs_match_the_code():
    """The diff blocks in version*/README.md are generated from the model files."""
    from conftest import run_cli
    proc = run_cli([REPO / "tools" / "make_version_diffs.py", "--check"], timeout=60)
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------ the checker itself
@pytest.mark.parametrize("text, expected", [
    ("python version1_baseline/tiny_llama_v1.py --preset tiny", None),
    ("python version1_baseline/tiny_llama_v1.py --no-such-flag", "do not parse"),
    ("python version1_baseline/tiny_llama_v1.py --seq-len 4096", "do not parse"),
    ("python version1_baseline/no_such_file.py", "does not exist"),
    ("python setup/check_environment.py --require triton", None),
    ("python setup/check_environment.py --bogus", "not in --help"),
    ("make workshop ARGS=--quiet", None),
    ("make no-such-target", "no Makefile target"),
    ("PYTORCH_TUNABLEOP_ENABLED=1 python version1_baseline/tiny_llama_v1.py --num-steps 20", None),
    ("rocprofv3 --kernel-trace -- python version1_baseline/tiny_llama_v1.py --bad", "do not parse"),
    ("pip install torch", None),
    ("cd profiling && ./run_ncu.sh v1 --preset small", None),
    ("cd version4_sdpa && ./run_all_profilers.sh --preset small", "does not exist"),
    ("cd version4_sdpa && ./no_such_script.sh", "does not exist"),
    ("./no_such_script.sh", "does not exist"),
])
def test_checker_catches_what_it_should(text, expected):
    problem = next(iter(check_line(text, PythonRunner())), None)
    if expected is None:
        assert problem is None, problem
    else:
        assert problem and expected in problem, problem


def test_extraction_handles_fences_continuations_and_inline(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("Run `python a.py --x` now.\n```bash\n# comment\npython b.py \\\n  --y 1\n```\n"
                   "```python\nprint('not a command')\n```\n")
    texts = [q.text for q in quoted_commands_at(doc)]
    assert texts == ["python a.py --x", "python b.py  --y 1"]


def quoted_commands_at(path: Path) -> list[Quoted]:
    with mock.patch(f"{__name__}.REPO", path.parent):
        return quoted_commands(path)


# ------------------------------------------------------------------ GPU-sized commands
# A command sized for a GPU: a training run at a GPU preset, graphs, a benchmark of GPU
# kernels or launches, the multi-GPU script, the publishing run. On a laptop each runs for
# minutes to hours (or refuses), so the docs mark it; a CPU user takes the command marked CPU.
GPU_SIZED = re.compile(
    r"(tiny_llama_v\d|stage\d_\w+\.py|run_all_stages|analysis_tools sweep|compare_versions"
    r"|run_all_profilers|benchmarks\.ceilings|benchmarks/ceilings)[^#]*--preset[ =](small|medium|large)\b"
    r"|^[^#]*--compile-mode[ =]reduce-overhead|benchmarks/host_overhead\.py|ddp_scaling\.sh"
    r"|reproduce\.sh(?![^#]*--(quick|list))|^make results\b|bench_kernels\.py(?![^#]*--quick)")


def fenced_lines(path: Path):
    """(line number, line) of every line inside a shell code block of a doc."""
    fence = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip().startswith("```"):
            fence = None if fence is not None else line.strip()[3:].strip().lower()
        elif fence in SHELL_LANGS - {""}:
            yield number, line


def test_gpu_sized_commands_are_marked_and_every_exercise_has_a_cpu_path():
    unmarked, no_cpu_path = [], []
    for path in doc_files():
        doc = str(path.relative_to(REPO))
        if doc == "docs/RESULTS.md":  # generated: the GPU results page and its reproduce command
            continue
        comments = []
        for number, line in fenced_lines(path):
            code, _, comment = line.partition(" # ")
            comments.append(comment)
            if (not line.strip().startswith("#") and not line.rstrip().endswith("\\")
                    and GPU_SIZED.search(line.strip()) and "GPU" not in comment):
                unmarked.append(f"{doc}:{number}: {line.strip()}")
        if doc.startswith("exercises/version") and not any("CPU" in c for c in comments):
            no_cpu_path.append(doc)
    assert unmarked == [], "mark these '# GPU' (and give a CPU-sized command beside them):\n" + "\n".join(unmarked)
    assert no_cpu_path == [], f"exercises without a command marked '# CPU': {no_cpu_path}"
