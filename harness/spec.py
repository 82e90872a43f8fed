"""What a version is, declared once beside its model.

Each version folder holds a `spec.py` with one `SPEC = VersionSpec(...)`: the modes it
runs in, its switches (their flags and help, which switch needs which, their defaults)
and what each switch changes in what autograd keeps alive. Everything that needs a fact
about a version reads it here: the command line builds the version's flags from it and
records the settled switches in the results JSON, compare_versions runs the modes it
lists, the memory model and the roofline model a run from its switches. A spec imports
no torch, so tools that only read it stay fast.

A switch's `memory` maps each of its values to the changes it makes to the memory
model's description of a run (the fields of analysis_tools.memory.Implementation); an
empty dict means "changes how the work is done, not what is saved". It has no default:
a new switch has to say what it does to memory.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

# Every mode a comparison runs in, as the flags a version's command line gets for it.
# "-master": bf16 weights with fp32 master copies in the optimizer (--optimizer master).
MODE_FLAGS: dict[str, list[str]] = {
    "eager": [],
    "compile": ["--compile"],
    "reduce-overhead": ["--compile", "--compile-mode", "reduce-overhead"],
    "max-autotune": ["--compile", "--compile-mode", "max-autotune"],
}
MODE_FLAGS.update({f"{mode}-master": [*MODE_FLAGS[mode], "--optimizer", "master"]
                   for mode in ("compile", "reduce-overhead")})


@dataclass(frozen=True)
class Switch:
    """One option of a version: a `--flag` (or, with flag=False, a fact the version's
    preflight chooses and records, such as the SDPA kernel that runs)."""
    name: str        # results JSON key and build_model keyword; the flag is --name-with-dashes
    help: str
    memory: dict     # value -> {Implementation field: value}; a value not listed changes nothing
    # the value when not asked, or a function of the model's ModelConfig giving it: a switch
    # that pays only at some model sizes is on by default exactly there (its help says where)
    default: object = True
    choices: tuple = ()   # a value switch; empty: an on/off switch
    needs: tuple = ()     # switches that must be on for this one to take effect
    off: str = "measures without it"  # what --no-<flag> does, for the help
    flag: bool = True

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def default_for(self, model=None):
        """The default for this model (a harness.config.ModelConfig)."""
        if not callable(self.default):
            return self.default
        if model is None:
            raise TypeError(f"{self.name}'s default depends on the model: pass its ModelConfig")
        return self.default(model)


@dataclass(frozen=True)
class VersionSpec:
    name: str                 # "v3": what results, tables and --versions call it
    adds: str                 # the one idea this version adds
    modes: tuple              # the MODE_FLAGS it is compared in (its first: its plain mode)
    memory: dict = field(default_factory=dict)  # Implementation fields before any switch
    switches: tuple = ()

    def __post_init__(self):
        unknown = [m for m in self.modes if m not in MODE_FLAGS]
        names = [s.name for s in self.switches]
        assert not unknown, f"{self.name}: unknown modes {unknown}"
        assert len(names) == len(set(names)), f"{self.name}: a switch declared twice"
        for i, s in enumerate(self.switches):  # needs point back, so one pass settles them
            assert set(s.needs) <= set(names[:i]), f"{self.name}: {s.name} needs a later switch"

    def switch(self, name: str) -> Switch:
        return next(s for s in self.switches if s.name == name)

    @property
    def flags(self) -> tuple:
        return tuple(s for s in self.switches if s.flag)

    def settle(self, asked: dict, model=None) -> dict:
        """Every flag switch's value as the model runs it: asked (or its default for this
        model, a ModelConfig; None asks for a model-dependent default), and an on/off switch
        whose needs are not all on is off. What the results record."""
        unknown = set(asked) - {s.name for s in self.flags}
        if unknown:
            raise KeyError(f"{self.name} has no switch {', '.join(sorted(unknown))}")
        settled = {}
        for s in self.flags:
            value = asked.get(s.name)
            if value is None and (s.name not in asked or callable(s.default)):
                value = s.default_for(model)
            if not s.choices and value and not all(settled[n] for n in s.needs):
                value = False
            settled[s.name] = value
        return settled

    # ---- the command line
    def add_arguments(self, group) -> None:
        for s in self.flags:
            needs = f" (with {' and '.join(self.switch(n).option for n in s.needs)})" if s.needs else ""
            if s.choices:
                group.add_argument(s.option, dest=s.name, choices=s.choices, default=s.default,
                                   help=f"{s.help}{needs}")
            else:  # a model-dependent default is None here: settle asks the model
                off = f"; --no-{s.option[2:]} {s.off}" if s.default else ""
                group.add_argument(s.option, dest=s.name, default=None if callable(s.default) else s.default,
                                   action=argparse.BooleanOptionalAction, help=f"{s.help}{needs}{off}")

    def options(self, args, model=None) -> dict:
        """The settled switches of parsed arguments for this model: what build_model gets."""
        return self.settle({s.name: getattr(args, s.name) for s in self.flags}, model)

    # ---- what a run keeps alive
    def memory_changes(self, options: dict, model=None) -> list[dict]:
        """The memory changes of a run's recorded options, in declaration order (a switch
        not recorded counts at its default for `model`). KeyError: an option this version lacks."""
        unknown = set(options) - {s.name for s in self.switches}
        if unknown:
            raise KeyError(", ".join(sorted(unknown)))
        changes = []
        for s in self.switches:
            value = options[s.name] if s.name in options else s.default_for(model)
            changes.append(s.memory.get(value, {}) if isinstance(value, (bool, str, type(None))) else {})
        return changes
