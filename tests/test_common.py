"""What V3's kernel families share (kernels/common.py): the launch, the operators torch.compile
and FlopCounterMode see, repeatable results. The bound launch's key and the cost of an eager call:

A bound launch calls the CompiledKernel an earlier call with the same key ran. A key that
misses one of Triton's specialisations would run a kernel compiled for other arguments
and compute wrong numbers silently, so each specialisation is shown to take its own
entry (on a CPU, from the key itself), and on a GPU a misaligned view after an aligned
one still matches the reference. Where the direct call is not available (the CPU
interpreter, V3_JIT_LAUNCH=1) Triton's own launch runs, with the same results.
"""
import contextlib
import sys

import pytest
import torch

from conftest import HAS_GPU, REPO

tk = pytest.importorskip("version3_triton.kernels", reason="needs triton")
from version3_triton.kernels import common, configs, launch_args, rmsnorm  # noqa: E402
from kernel_checks import assert_matches, attention_inputs, forward_backward, rope_inputs  # noqa: E402

DEVICE = "cuda" if HAS_GPU else "cpu"
pytestmark = pytest.mark.usefixtures("poisoned_kernels")


def key(*args, fn=rmsnorm._rmsnorm_fwd_kernel, device=0, **constexprs):
    return common._bound_key(fn, device, args, constexprs or dict(ADD_DELTA=False, BLOCK_COLS=64))[0]


def test_every_specialisation_triton_makes_takes_its_own_entry():
    x = torch.zeros(64, dtype=torch.float32)
    base = key(x, 8, 16, 1e-5, None)
    others = [
        key(x.to(torch.float16), 8, 16, 1e-5, None),       # a tensor's dtype
        key(x[1:], 8, 16, 1e-5, None),                       # its 16-byte alignment
        key(x, 1, 16, 1e-5, None),                           # an int equal to 1
        key(x, 8, 17, 1e-5, None),                           # an int no longer divisible by 16
        key(x, 8, 2 ** 31, 1e-5, None),                      # an int past 32 bits
        key(x, 8, 16, 1e-5, x),                              # None (a constexpr) or a tensor
        key(x, True, 16, 1e-5, None),                        # a bool, though True == 1
        key(x, 8, 16, 1e-5, None, ADD_DELTA=True, BLOCK_COLS=64),   # a constexpr's value
        key(x, 8, 16, 1e-5, None, BLOCK_COLS=64, ADD_DELTA=False),  # constexprs by name
        key(x, 8, 16, 1e-5, None, device=1),                 # the device
        key(x, 8, 16, 1e-5, None, fn=rmsnorm._rmsnorm_bwd_kernel),  # the kernel
    ]
    assert len({base, *others}) == len(others) + 1
    assert key(torch.ones(64), 8, 16, 1e-5, None) == base  # new data, same kind: the same entry
    assert key(x, 8, 16, 1e-5, None) == base


def test_forced_configurations_and_the_autotune_switch_take_their_own_entries(monkeypatch):
    """num_warps, num_stages and the block sizes come from the rule, the autotuner or a pin:
    a new pin (num_warps=8) or autotuning switched off never reuses a launch bound before."""
    x = torch.zeros(64)
    before = key(x, 8)
    configs.FORCED_CONFIGS["rmsnorm_fwd"] = dict(BLOCK_ROWS=1, num_warps=8)
    pinned = key(x, 8)
    configs.FORCED_CONFIGS["rmsnorm_fwd"] = dict(BLOCK_ROWS=1, num_warps=2)
    repinned = key(x, 8)
    del configs.FORCED_CONFIGS["rmsnorm_fwd"]
    monkeypatch.setattr(configs, "AUTOTUNE", not configs.AUTOTUNE)
    assert len({before, pinned, repinned, key(x, 8)}) == 4


def test_triton_launches_where_the_direct_call_is_not_available():
    """The CPU interpreter (and V3_JIT_LAUNCH=1) launch through Triton, with the same results."""
    if HAS_GPU:
        pytest.skip("on a GPU the bound launch runs: test_gpu_bound_launch_matches_triton_s")
    assert not common.BIND and not common._BOUND
    x, w = torch.randn(5, 48), torch.randn(48)
    y = tk.rms_norm(x, w)
    assert torch.allclose(y, rmsnorm.rms_norm_reference(x, w), atol=1e-5)
    assert not common._BOUND


class _KnownLauncher:  # the __call__ of Triton 3.6's NVIDIA launcher, in shape
    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        global_scratch = profile_scratch = None
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid,
                    self.launch_pdl, global_scratch, profile_scratch, *args)


class _OtherLauncher:  # one that passes its arguments differently (as Triton 3.9's does)
    def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                 launch_enter_hook, launch_exit_hook, *args):
        self.launch(gridX, gridY, gridZ, stream, function, kernel_metadata, args)


def test_the_c_launch_is_called_only_behind_the_launcher_it_knows():
    """The bound launch calls Triton's C launch function itself only where the launcher's
    __call__ is the known one; any other launcher (another Triton) is called as Triton
    calls it."""
    assert common._launcher_is_known(_KnownLauncher)
    assert not common._launcher_is_known(_OtherLauncher)
    assert not common._launcher_is_known(int)  # no Python source: not known


@pytest.mark.gpu
def test_gpu_bound_launch_matches_triton_s(monkeypatch):
    """Every kernel family, bound and through Triton, gives identical bits; a misaligned
    view after an aligned one (same shapes) takes a new entry and still matches."""
    assert common.BIND, "the bound launch should be available on this GPU"

    def run():
        torch.manual_seed(0)
        x = torch.randn(33, 4, 96, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(96, device=DEVICE, requires_grad=True)
        qkv = torch.randn(2, 40, 8, 32, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
        cos, sin = torch.randn(40, 32, device=DEVICE), torch.randn(40, 32, device=DEVICE)
        out = (tk.rms_norm(x, w).float().sum() + tk.swiglu(x).float().sum()
               + tk.qkv_attention(qkv, cos, sin, 4).float().sum())
        out.backward()
        return [t.detach().clone() for t in (out, x.grad, w.grad, qkv.grad)]

    monkeypatch.setattr(common, "BIND", False)
    through_triton = run()
    monkeypatch.setattr(common, "BIND", True)
    monkeypatch.setattr(common, "DIRECT_C_LAUNCH", False)  # bound, called through Triton's launcher
    common.forget_plans()
    run()
    through_launcher = run()
    monkeypatch.setattr(common, "DIRECT_C_LAUNCH", True)
    common.forget_plans()
    run()  # binds
    entries = len(common._BOUND)
    bound = run()
    assert len(common._BOUND) == entries  # the second step reuses every entry
    assert common.PLANS  # and replays the plans of attention's and the norms' launchers
    assert all(torch.equal(a, b) for a, b in zip(bound, through_triton))
    assert all(torch.equal(a, b) for a, b in zip(through_launcher, through_triton))
    print(common.launch_path())

    buffer = torch.randn(2 * 64 * 96 + 8, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(96, device=DEVICE, dtype=torch.bfloat16)
    aligned, misaligned = buffer[:2 * 64 * 96].view(128, 96), buffer[1:1 + 2 * 64 * 96].view(128, 96)
    assert misaligned.data_ptr() % 16
    plans = len(common.PLANS)
    for x in (aligned, aligned, misaligned, aligned, misaligned):  # the aligned ones replay a plan
        want = rmsnorm.rms_norm_reference(x.double(), w.double())
        assert torch.allclose(tk.rms_norm(x, w).double(), want, atol=2e-2, rtol=2e-2)
    assert len(common._BOUND) == entries + 2 and len(common.PLANS) == plans + 1

    # The direct call passes addresses: a CPU tensor where a bound call had a GPU one takes
    # its own entry, and Triton's launch refuses it (a CPU address would crash the kernel).
    y = torch.empty_like(aligned)
    args = (aligned, None, w, None, y, 128, 96, 96, 0, 96, 1e-5)
    constexprs = dict(ADD_DELTA=False, BLOCK_COLS=128)
    assert key(*args, **constexprs) != key(aligned.cpu(), *args[1:], **constexprs)
    for x in (aligned, aligned):  # the second one runs bound
        common.launch(rmsnorm.FWD, rmsnorm._rmsnorm_fwd_kernel, rmsnorm.TUNING_KEY,
                      lambda c: (128,), x, *args[1:], **constexprs)
    with pytest.raises((ValueError, RuntimeError), match=r"(?i)cpu"):
        common.launch(rmsnorm.FWD, rmsnorm._rmsnorm_fwd_kernel, rmsnorm.TUNING_KEY,
                      lambda c: (128,), aligned.cpu(), *args[1:], **constexprs)


# ---- launch plans: a warm call replays its launches ----------------------------------------
class FakeBoundLaunches:
    """Bound launches without a GPU: common.launch records what it is given (tensors as
    their addresses) and, while a launcher records a plan, hands common.py a launcher that
    records what a replay passes. So the record and replay of launch plans run on a CPU."""

    def __init__(self, monkeypatch):
        self.calls = []
        monkeypatch.setattr(common, "BIND", True)
        monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
        monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 7, raising=False)
        monkeypatch.setattr(common, "launch", self.launch)
        monkeypatch.setattr(common, "PLANS", {})

    def launch(self, spec, fn, key, grid, *args, **constexprs):
        self.calls.append(("launch", spec.name, [a.data_ptr() if isinstance(a, torch.Tensor) else a
                                                 for a in args]))
        if common._RECORDING is not None:
            common._record((self.replayed, (1, 1, 1), ("head",), args, ("tail",), spec.name,
                            ("rule", {}), 0))

    def replayed(self, *launch_args):
        grid, stream, head, args, tail = (launch_args[:3], launch_args[3], launch_args[4],
                                          list(launch_args[5:-1]), launch_args[-1])
        assert (grid, stream, head, tail) == ((1, 1, 1), 7, "head", "tail")
        self.calls.append(("replay", None, args))

    def take(self) -> list:
        calls, self.calls = self.calls, []
        return calls


@pytest.fixture
def fake_bound(monkeypatch):
    return FakeBoundLaunches(monkeypatch)


def _planned_calls():
    """Each planned launcher, as a function of fresh inputs (same layouts on every call)."""
    def attention():
        (q, k, v), grad = attention_inputs(1, 4, 2, 16, 16)
        return lambda: tk.attention_forward(q, k, v, 0.25), (q, k, v)

    def attention_backward():
        (q, k, v), grad = attention_inputs(1, 4, 2, 16, 16)
        o, lse = torch.randn_like(q), torch.randn(1, 4, 16)
        return lambda: tk.attention_backward(grad, q, k, v, o, lse, 0.25), (grad, q, k, v, o, lse)

    def qkv_attention_backward():  # the gradient slots: one QKV-shaped tensor, heads by offset
        qkv, cos, sin = rope_inputs(1, 16, 8, 16)
        q, k, v = qkv[:, :, :4].transpose(1, 2), qkv[:, :, 4:6].transpose(1, 2), qkv[:, :, 6:].transpose(1, 2)
        d_qk, d_qkv, grad_o = torch.empty(1, 16, 6, 16), torch.empty(1, 16, 8, 16), torch.randn(1, 4, 16, 16)
        o, lse = torch.randn(1, 4, 16, 16), torch.randn(1, 4, 16)
        from version3_triton.kernels.flash_attention_backward import attention_backward_into
        return (lambda: attention_backward_into(grad_o, q, k, v, o, lse, 0.25, (d_qk, 0), (d_qk, 4),
                                                (d_qkv, 6)),
                (grad_o, qkv, o, lse, d_qk, d_qkv))

    def attention_rope():  # the variant: RoPE's tables follow the plain kernels' arguments
        (q, k, v), grad = attention_inputs(1, 4, 2, 16, 16)
        _, cos, sin = rope_inputs(1, 16, 8, 16)
        o, lse = torch.randn_like(q), torch.randn(1, 4, 16)
        from version3_triton.kernels import attention_rope as rope
        return (lambda: (rope.attention_rope_forward(q, k, v, 0.25, cos, sin),
                         rope.attention_rope_backward(grad, q, k, v, o, lse, 0.25, cos, sin)),
                (grad, q, k, v, o, lse, cos, sin))

    def norm(add):
        x, delta, w, grad = torch.randn(6, 64), torch.randn(6, 64), torch.randn(64), torch.randn(6, 64)
        if add:
            return lambda: rmsnorm.add_rmsnorm_backward(grad, grad, x, w, 1e-5, torch.float16), (grad, x, w)
        return (lambda: (rmsnorm.rmsnorm_forward(x, w, 1e-5),
                         rmsnorm.add_rmsnorm_forward(x, delta, w, 1e-5)), (x, delta, w))

    return {"attention forward": attention, "attention backward": attention_backward,
            "qkv attention backward": qkv_attention_backward,
            "attention with RoPE on load": attention_rope,
            "rms_norm and add_rms_norm forward": lambda: norm(False),
            "add_rms_norm backward": lambda: norm(True)}


@pytest.mark.parametrize("launcher", list(_planned_calls()))
def test_a_replayed_plan_passes_what_the_launcher_would(fake_bound, launcher):
    """The first call records its launches; a call with new tensors of the same layouts
    replays them, passing every argument the launcher's own way passes for those tensors
    (the addresses of this call's inputs, and outputs of the same layout)."""
    make = _planned_calls()[launcher]
    make()[0]()
    first = fake_bound.take()
    assert common.PLANS and all(kind == "launch" for kind, *_ in first)
    call, inputs = make()
    call()
    replayed = fake_bound.take()
    assert [kind for kind, *_ in replayed] == ["replay"] * len(first)
    common.PLANS.clear()
    call()  # the launcher's own way, same inputs
    own_way = fake_bound.take()
    spans = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in inputs]

    def in_an_input(address):  # the inputs' memory, views into it included
        return any(start <= address < start + size for start, size in spans)

    for (_, _, got), (_, _, want) in zip(replayed, own_way):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            if g != w:  # only an output may differ: a new buffer on each call
                assert not in_an_input(w) and not in_an_input(g) and g > 2 ** 32


def test_every_fact_of_a_call_takes_its_own_plan(fake_bound, monkeypatch):
    """A plan key holds each input's shape, strides, dtype and device, the values the
    launcher launches by, the current device, the forced configurations and the autotune switch."""
    x, w = torch.zeros(4, 64), torch.zeros(64)

    def key(x=x, w=w, eps=1e-5, out_dtype=None):
        return common.plan_key("rms_fwd", (x, None, w), eps, out_dtype)

    base = key()
    others = [key(x=torch.zeros(8, 64)), key(x=torch.zeros(64, 4).t()), key(x=x.half()),
              key(w=w.double()), key(eps=1e-6), key(out_dtype=torch.bfloat16),
              common.plan_key("rms_fwd", (x, w, w), 1e-5, None)]
    with monkeypatch.context() as m:
        m.setattr(torch._C, "_cuda_getDevice", lambda: 1, raising=False)
        others.append(key())
    configs.FORCED_CONFIGS["rmsnorm_fwd"] = dict(BLOCK_ROWS=1, num_warps=8)
    others.append(key())
    del configs.FORCED_CONFIGS["rmsnorm_fwd"]
    monkeypatch.setattr(configs, "AUTOTUNE", not configs.AUTOTUNE)
    others.append(key())
    assert len({base, *others}) == len(others) + 1
    assert key(x=torch.ones(4, 64)) == key()  # new data, same kind: the same plan


def test_a_replay_refuses_a_misaligned_tensor_or_a_broken_alias(fake_bound):
    """Triton specialises on 16-byte alignment: a misaligned tensor after an aligned one
    takes the launcher's own way. So does a call that passes two tensors where the
    recorded one passed one tensor twice (the QKV gradient's slots)."""
    buffer, w = torch.randn(4 * 64 + 4), torch.randn(64)
    aligned, misaligned = buffer[:256].view(4, 64), buffer[1:257].view(4, 64)
    for x in (aligned, aligned, misaligned):
        rmsnorm.rmsnorm_forward(x, w, 1e-5)
    assert [kind for kind, *_ in fake_bound.take()] == ["launch", "replay", "launch"]

    make = _planned_calls()["qkv attention backward"]
    make()[0]()
    fake_bound.take()
    qkv, grad_o = rope_inputs(1, 16, 8, 16)[0], torch.randn(1, 4, 16, 16)
    q, k, v = qkv[:, :, :4].transpose(1, 2), qkv[:, :, 4:6].transpose(1, 2), qkv[:, :, 6:].transpose(1, 2)
    o, lse, d_qkv = torch.randn(1, 4, 16, 16), torch.randn(1, 4, 16), torch.empty(1, 16, 8, 16)
    from version3_triton.kernels.flash_attention_backward import attention_backward_into
    attention_backward_into(grad_o, q, k, v, o, lse, 0.25, (torch.empty(1, 16, 6, 16), 0),
                            (torch.empty(1, 16, 6, 16), 4), (d_qkv, 6))
    assert [kind for kind, *_ in fake_bound.take()] == ["launch", "launch"]


def test_a_plan_records_only_its_own_threads_launches(fake_bound):
    """A launch another thread makes while a launcher records is not part of its plan."""
    import threading

    x, y, w = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64)
    key = common.plan_key("rms_fwd", (x, None, w), 1e-5, None)
    other = threading.Thread(target=rmsnorm.rmsnorm_forward, args=(y, w, 1e-5))
    with common.recording(key, (x, None, w)):
        other.start()
        other.join()
        common.launch(rmsnorm.FWD, None, None, None, x, w)
    device, same, launches = common.PLANS[key]
    assert len(launches) == 1 and launches[0][4] == ((0, 0, 0, None), (1, 2, 0, None))  # x, w: not y


class FakeDescriptor:
    """What a TMA descriptor shows the launch: its tensor, the 2D view TMA reads, the tile."""

    def __init__(self, base, rows, cols):
        self.base, self.shape, self.strides = base, [rows, cols], [cols, 1]
        self.block_shape, self.padding = [16, cols], "zero"


def test_a_plan_replays_tma_descriptors_and_views_of_named_tensors(fake_bound):
    """A fixed launch (the Hopper kernels') records into a plan: a descriptor of a named
    tensor replays as the tensor map Triton's C launch takes (MapLaunch's, encoded once per
    address, shape and strides), the plan calling that C launch itself; a view the
    launcher made of a named tensor replays at the view's offset in this call's tensor."""
    encoded, launched = [], []

    def encode(described, meta):
        encoded.append(described.base.data_ptr())
        return [("map", described.data_ptr(), meta), *described.shape, *described.strides]

    # the C launch's arguments: the grid, the stream and the head (5), then the kernel's
    launcher = launch_args.MapLaunch(lambda *args: launched.append(args), encode, 5, {0: "meta"})

    def call(q, grad, scale=0.5):
        view = grad[:, 2:]  # a view made inside the launcher, as the gradient slots are
        args = [FakeDescriptor(q, 4 * 8, 16), view, scale, 8]
        key, _ = common._bound_key(call, 0, args, {})
        common._BOUND[key] = (launcher, ("head",), ("tail",), None, call)
        plan = common.plan_key("fixed", (q, grad))
        with common.recording(plan, [q, grad]):
            common.launch_fixed(call, (3,), args, ("fixed", ("how", {})))
        return plan

    q, grad = torch.randn(4, 8, 16), torch.randn(4, 6, 16)
    plan = call(q, grad)
    assert len(launched) == 1 and encoded == [q.data_ptr()]
    q2, grad2 = torch.randn(4, 8, 16), torch.randn(4, 6, 16)
    assert common.replay(common.PLANS[plan], (q2, grad2)) and common.replay(common.PLANS[plan],
                                                                           (q2, grad2))
    assert encoded == [q.data_ptr(), q2.data_ptr()]  # the second replay's map was kept
    want = [3, 1, 1, 7, "head", ("map", q2.data_ptr(), "meta"), 32, 16, 16, 1,
            grad2[:, 2:].data_ptr(), 0.5, 8, "tail"]
    assert [list(args) for args in launched[1:]] == [want, want]
    common._BOUND.clear()


def test_map_launch_leaves_other_launches_alone():
    """Only Triton 3.6's wrapper that encodes tensor maps becomes a MapLaunch; any other
    launch (a later Triton's, a plain function) is called as it is, and a plan then records
    no descriptor."""
    def launch(*args):
        return args

    assert launch_args.map_launch(launch) is launch
    assert launch_args.map_launch(print) is print
    t = torch.randn(4, 16)
    maps = launch_args.MapLaunch(launch, lambda d, meta: ["map", *d.shape, *d.strides], 5,
                                 {0: "meta"})
    # a plan calls the C launch with each map's shape and strides in place after it
    called, template, found = launch_args.slots([FakeDescriptor(t, 4, 16), t, 3], {id(t): 0},
                                                maps)
    assert called is launch and template == [None, 4, 16, 16, 1, None, 3]
    assert [slot[:3] for slot in found] == [(0, 0, 0), (5, 0, 0)] and found[1][3] is None
    assert isinstance(found[0][3], launch_args.Maps) and found[0][3][t.data_ptr()] == "map"
    assert launch_args.slots([t], {id(t): 0}, maps) is None  # the map the launch expects: none
    assert launch_args.slots([FakeDescriptor(t, 4, 16)], {id(t): 0}, launch) is None
    assert launch_args.slots([t[1:]], {}, launch) is None  # a view of no named tensor
    assert launch_args.slots([t.view(-1)[1:]], {id(t): 0}, launch) is None  # misaligned


# ---- the eager path's depth --------------------------------------------------------------
def project_frames(call) -> list[str]:
    """The project's own Python functions one warm call enters before it hands a kernel to
    common.launch (what launch does next is the bound or Triton's launch, timed by
    benchmarks/host_overhead.py), in order."""
    call()
    entered, inside_launch = [], []

    def watch(frame, event, arg):
        code = frame.f_code
        name = code.co_filename
        if not name.startswith(str(REPO)) or "/tests/" in name or "-packages/" in name:
            return
        if event == "call":
            if not inside_launch:
                entered.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}")
            if code is common.launch.__code__ or inside_launch:
                inside_launch.append(code)
        elif event == "return" and inside_launch:
            inside_launch.pop()

    sys.setprofile(watch)
    try:
        call()
    finally:
        sys.setprofile(None)
    return entered


# The project frames of a warm eager call today (forward / forward + backward), counted with
# the bound launches faked (FakeBoundLaunches above): the path a warm call takes on a GPU,
# through its launcher's plan where it has one. A change that adds layers shows up here:
# look at the host-overhead table before raising a number.
DEPTH = {"rms_norm": (10, 21), "add_rms_norm": (11, 22), "swiglu": (10, 19), "qkv_attention": (19, 43)}


@pytest.mark.parametrize("op", list(DEPTH))
def test_the_eager_path_stays_shallow(op, fake_bound):
    x = torch.randn(4, 64, device=DEVICE, requires_grad=True)
    w = torch.randn(64, device=DEVICE, requires_grad=True)
    qkv = torch.randn(1, 16, 8, 16, device=DEVICE, requires_grad=True)
    cos, sin = torch.randn(16, 16, device=DEVICE), torch.randn(16, 16, device=DEVICE)
    forward = {"rms_norm": lambda: tk.rms_norm(x, w), "add_rms_norm": lambda: tk.add_rms_norm(x, x, w)[1],
               "swiglu": lambda: tk.swiglu(x), "qkv_attention": lambda: tk.qkv_attention(qkv, cos, sin, 4)}[op]
    fwd = project_frames(forward)

    def forward_backward():  # a dense gradient, as a training step's (sum()'s is a broadcast)
        out = forward()
        out.backward(torch.ones_like(out))

    both = project_frames(forward_backward)
    assert len(fwd) <= DEPTH[op][0] and len(both) <= DEPTH[op][1], (len(fwd), len(both), fwd, both)


# ---- the operators: what torch.compile and FlopCounterMode see; repeatable results -------
def test_ops_are_registered_and_counted_by_flop_counter():
    """The operators carry SDPA's FLOP formula. torch.compile traces them; eager calls
    of flash_attention use them only inside common.eager_operators() (elsewhere they
    call the launchers directly, without the operators' host cost, unseen by the counter)."""
    from torch.utils.flop_counter import FlopCounterMode

    (q, k, v), grad = attention_inputs(1, 4, 2, 16, 32)
    ops = torch.ops.tinyllama_v3
    forward = 4 * 1 * 4 * 16 * 16 * 32  # PyTorch's SDPA convention: 4*B*H*Tq*Tk*D
    expected = {"tinyllama_v3.attention_forward": forward,
                "tinyllama_v3.attention_backward": 2.5 * forward}

    def counts(run, scope=contextlib.nullcontext()) -> dict:
        with scope, FlopCounterMode(display=False) as counter:
            run()
        return {str(op): n for op, n in counter.get_flop_counts().get("Global", {}).items()}

    def operators():
        o, lse = ops.attention_forward(q, k, v, 0.25)
        ops.attention_backward(torch.ones_like(o), q, k, v, o, lse, 0.25)

    def autograd():
        forward_backward(tk.flash_attention, [q, k, v], grad)

    assert counts(operators) == expected
    assert counts(autograd, common.eager_operators()) == expected
    assert counts(autograd) == {}  # eager: the launchers, unseen

    def hopper_operators():  # the opaque ones a traced step calls where the Hopper kernels run
        o, lse = ops.attention_forward_hopper(q, k, v, 0.25)
        ops.attention_backward_hopper(torch.ones_like(o), q, k, v, o, lse, 0.25)

    assert counts(hopper_operators) == {f"{name}_hopper": n for name, n in expected.items()}
    from torch.utils.flop_counter import flop_registry
    assert ops.qkv_attention_backward_hopper in flop_registry


def test_torch_compile_traces_through_the_custom_ops():
    """aot_eager: dynamo + fake tensors + AOT autograd, without generating C++ code."""
    (q, k, v), grad = attention_inputs(1, 2, 1, 17, 16)
    w = torch.randn(16, device=DEVICE)

    def block(q, k, v, w):
        return tk.flash_attention(tk.rms_norm(q, w), k, v)

    torch._dynamo.reset()
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    got = forward_backward(compiled, [q, k, v, w], grad)
    want = forward_backward(block, [q, k, v, w], grad)
    assert_matches(got, want, 1e-6, ["out", "dq", "dk", "dv", "dw"])


def test_inductor_launches_our_kernels_with_its_static_launcher():
    """Inductor's C++ launcher, not Triton's Python one, for the kernels it finds in V3's
    operators (operators._launch_statically): the host time a compiled step needs."""
    import torch._inductor.config as inductor_config
    if not common.USE_TRITON_OP or not hasattr(inductor_config,
                                               "static_launch_user_defined_triton_kernels"):
        pytest.skip(f"torch {torch.__version__}: no triton_op, or no static launch of its kernels")
    assert inductor_config.static_launch_user_defined_triton_kernels


@pytest.mark.gpu
def test_gpu_repeated_runs_are_bit_identical():
    """No atomics, no races: the same inputs give the same bits, every time."""
    inputs, grad = attention_inputs(4, 8, 2, 300, 64)
    first = forward_backward(tk.flash_attention, inputs, grad, torch.bfloat16)
    x, w = torch.randn(4096, 1024, device=DEVICE), torch.randn(1024, device=DEVICE)
    norm_grad = torch.randn_like(x)
    norm_first = forward_backward(tk.rms_norm, [x, w], norm_grad, torch.bfloat16)
    for _ in range(3):
        again = forward_backward(tk.flash_attention, inputs, grad, torch.bfloat16)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
        norm_again = forward_backward(tk.rms_norm, [x, w], norm_grad, torch.bfloat16)
        assert all(torch.equal(a, b) for a, b in zip(norm_first, norm_again))
    y, cos, sin = rope_inputs(4, 300, 24, 64)
    rope_first = forward_backward(lambda t: tk.rope(t, cos, sin), [y], y, torch.bfloat16)
    rope_again = forward_backward(lambda t: tk.rope(t, cos, sin), [y], y, torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(rope_first, rope_again))


@pytest.mark.gpu
def test_gpu_inductor_launches_the_kernels_itself():
    """With triton_op, torch.compile (Inductor) traces into the operators: its
    generated code launches our Triton kernels directly (no call back into the
    tinyllama_v3 operators) and computes what eager mode computes."""
    if not common.USE_TRITON_OP:
        pytest.skip(f"torch {torch.__version__} has no torch.library.triton_op")
    from torch._inductor.utils import run_and_get_code

    (q, k, v), grad = attention_inputs(2, 4, 2, 130, 64)
    w = torch.randn(64, device=DEVICE)

    def block(q, k, v, w):
        return tk.flash_attention(tk.rms_norm(q, w, 1e-5, torch.bfloat16), k, v)

    inputs = [t.to(torch.bfloat16) for t in (q, k, v)] + [w]
    want = forward_backward(block, inputs, grad.to(torch.bfloat16))
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    got, codes = run_and_get_code(forward_backward, compiled, inputs, grad.to(torch.bfloat16))
    code = "\n".join(codes)
    for kernel in ("_rmsnorm_fwd_kernel", "_attn_fwd_kernel", "_rmsnorm_bwd_kernel",
                   "_attn_bwd_dq_kernel", "_attn_bwd_dkdv_kernel"):
        assert kernel in code, f"{kernel} is not launched by Inductor's code"
    assert "torch.ops.tinyllama_v3" not in code, "the compiled code calls back into Python"
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


def test_kernels_call_their_triton_helpers_by_name():
    """torch.compile (Inductor) copies a kernel and the @triton.jit helpers it calls into the
    code it generates, finding them by name: a helper called through a module
    (`row_sums.helper(...)`) compiles in eager runs and fails under torch.compile."""
    import ast
    import importlib
    import inspect
    import pkgutil
    import textwrap

    from triton.runtime.jit import KernelInterface  # a JIT function, or the interpreter's
    import version3_triton.kernels as package
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for fn in vars(module).values():
            if (not isinstance(fn, KernelInterface)
                    or fn.fn.__module__ != module.__name__):  # (imported ones: their own module)
                continue
            for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name)):
                    owner = module.__dict__.get(node.func.value.id)  # one of our modules?
                    ours = getattr(owner, "__name__", "").startswith(package.__name__)
                    helper = isinstance(getattr(owner, node.func.attr, None), KernelInterface)
                    assert not (ours and helper), \
                        f"{info.name}.{fn.__name__} calls {node.func.value.id}.{node.func.attr}"
