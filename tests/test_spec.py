"""Each version declares itself once (harness/spec.py, <version folder>/spec.py)."""
import itertools
from dataclasses import fields

import pytest

from harness.config import PRESETS, VERSIONS, load_spec, load_version
from harness.spec import MODE_FLAGS, Switch, VersionSpec


def test_a_switch_is_on_only_where_everything_it_needs_is_on():
    spec = VersionSpec("vx", "a test", ("eager",), switches=(
        Switch("a", "a", memory={}), Switch("b", "b", memory={}, needs=("a",)),
        Switch("c", "c", memory={}, needs=("b",)), Switch("d", "d", memory={}, default=False)))
    assert spec.settle({}) == {"a": True, "b": True, "c": True, "d": False}
    assert spec.settle({"a": False}) == {"a": False, "b": False, "c": False, "d": False}
    with pytest.raises(KeyError):
        spec.settle({"e": True})
    with pytest.raises(AssertionError, match="needs a later switch"):
        VersionSpec("vy", "", ("eager",), switches=(Switch("b", "", memory={}, needs=("a",)),
                                                      Switch("a", "", memory={})))
    with pytest.raises(AssertionError, match="unknown modes"):
        VersionSpec("vz", "", ("warp-speed",))


def test_settled_switches_settle_to_themselves():
    """The command line settles a run's switches (to record them and check them before the
    model is built) and build_model settles whatever it is given: switches settled once are
    settled for good, so the two agree and the rule has one home, VersionSpec.settle."""
    for name, preset in itertools.product(VERSIONS, ("medium", "large")):  # defaults of both vocabularies
        spec, model = load_spec(name), PRESETS[preset].model
        asked = [{}] + [{s.name: not s.default_for(model)} for s in spec.flags if not s.choices]
        for switches in asked:
            settled = spec.settle(switches, model)
            assert spec.settle(settled, model) == settled, (name, preset, switches)


def test_every_version_s_spec_matches_its_model():
    """The spec's switches are the model's own: V2's Fusions, V3's Kernels, V4's backends."""
    for name in VERSIONS:
        spec = load_spec(name)
        assert spec.name == name and spec.modes and set(spec.modes) <= set(MODE_FLAGS)
        assert load_version(name).SPEC is spec
    v2, v3 = load_version("v2"), load_version("v3")
    fusions = [f.name for f in fields(v2.Fusions)]
    assert [s.name for s in load_spec("v2").flags] == fusions
    assert [s.name for s in load_spec("v3").flags] == fusions + [f.name for f in fields(v3.Kernels)]
    from torch.nn.attention import SDPBackend
    from version4_sdpa.spec import BACKENDS
    assert all(hasattr(SDPBackend, member) for member in BACKENDS.values())


def test_a_preflight_records_only_what_the_spec_declares(monkeypatch):
    import training
    from training import cli
    monkeypatch.setattr("training.trainer.run", lambda *a, **k: None)
    spec = load_spec("v2")
    with pytest.raises(AssertionError, match="undeclared"):
        training.main(spec, None, preflight=lambda args, run: {"surprise": 1}, argv=["--output", "x.json"])
    assert cli.main(spec, None, argv=["--output", "x.json"]) == 0
