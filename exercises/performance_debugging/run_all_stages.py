"""Run every performance-debugging stage, broken and --fixed, and print the symptom of each.

    python exercises/performance_debugging/run_all_stages.py                  # tiny, this device
    python exercises/performance_debugging/run_all_stages.py --preset medium  # on a GPU
    python exercises/performance_debugging/run_all_stages.py --stages 1 4     # some stages

Each stage is V1 with ONE planted mistake (see README.md in this folder). For each, this
script runs the broken and the fixed variant through the shared harness and applies the
check that exposes the mistake. Some symptoms only exist on a GPU (asynchronous
execution, memory coalescing, BLAS-vs-Triton speed); on a CPU those stages say so in
one line instead of printing meaningless numbers.

Exit code: 0 when every check that can be seen on this device tripped, 1 otherwise.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # Before anything imports triton (the harness records its version in every result).
    os.environ.setdefault("TRITON_INTERPRET", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402  (puts the repository on sys.path)

from harness import ModelConfig, flops  # noqa: E402
from harness.results import load, numbers, write_json  # noqa: E402

STAGES = {  # number: (module, planted mistake, the check that exposes it)
    1: ("stage1_bad_init", "weights drawn from N(0, 1), not N(0, 0.02)",
        "first loss vs ln(vocab_size)"),
    2: ("stage2_noncontiguous", "transposed views handed to a Triton kernel",
        "tokens/s vs fixed; strides the kernel saw"),
    3: ("stage3_unsynchronized_timing", "host clocks, no synchronize",
        "phases vs step time; forward TFLOP/s vs fixed and peak"),
    4: ("stage4_cut_graph", "RMSNorm kernel without backward",
        "gradient guard (exit 5); bwd/fwd ratio"),
    5: ("stage5_triton_gemm", "hand-written Triton GEMM for every linear",
        "tokens/s vs fixed (BLAS)"),
}


@dataclass
class Outcome:
    stage: int
    tripped: bool | None  # None: not observable on this device
    symptom: str


class StageRunner:
    """Runs a stage in this process (one torch import for all), quietly, into a temp folder."""

    def __init__(self, out_dir: Path, common_args: list[str], gpu: bool):
        self.out_dir, self.common_args, self.gpu = out_dir, common_args, gpu

    def interpreter_args(self) -> list[str]:
        """On a CPU, Triton kernels run in the interpreter - thousands of times slower:
        3 steps are enough to show they are correct."""
        return [] if self.gpu else ["--num-steps", "3", "--warmup-steps", "1"]

    def run(self, stage: int, extra: list[str], tag: str):
        module = importlib.import_module(STAGES[stage][0])
        output = self.out_dir / f"stage{stage}_{tag}.json"
        output.unlink(missing_ok=True)
        argv = [*self.common_args, *extra, "--quiet", "--output", str(output)]
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = module.main(argv)
        result = load(output) if code == 0 and output.exists() else None
        message = (stderr.getvalue().strip().splitlines() or stdout.getvalue().strip().splitlines()
                   or [""])[-1]
        return code, result, message

    def pair(self, stage: int, extra: list[str] = ()):
        """--fixed first, then broken (what a stage records is then the broken run's)."""
        _, fixed, _ = self.run(stage, ["--fixed", *extra], "fixed")
        _, broken, message = self.run(stage, list(extra), "broken")
        return broken, fixed, message


def tokens_per_s(r: dict) -> float:
    return numbers(r)["tokens_per_s"]


def median(r: dict, phase: str) -> float:
    return numbers(r)[f"{phase}_ms"]


# ------------------------------------------------------------------ one check per stage
def check_stage1(run: StageRunner) -> Outcome:
    broken, fixed, msg = run.pair(1)
    if broken is None:  # large models overflow outright: exit 4 is the same symptom
        return Outcome(1, True, f"the run failed: {msg}")
    expected = common.expected_first_loss(broken["config"]["vocab_size"])
    first, first_fixed = broken["losses"][0], fixed["losses"][0]
    return Outcome(1, first > 1.5 * expected,
                   f"first loss {first:.2f} vs ln(vocab) = {expected:.2f} (fixed: {first_fixed:.2f})")


def check_stage2(run: StageRunner) -> Outcome:
    stage = importlib.import_module(STAGES[2][0])
    if stage.triton is None:
        return Outcome(2, None, "skipped: triton is not installed")
    broken, fixed, msg = run.pair(2, run.interpreter_args())
    if broken is None:
        return Outcome(2, False, f"the run failed: {msg}")
    seen = stage.input_strides()
    # The kernel is one of many in the step: on an H200 at the medium size the whole step
    # loses 5-10% (the kernel itself several times), so 3% is the bar, above process noise.
    return compare_speed(2, run, broken, fixed, 1.03,
                         f"kernel read gate{seen['shape']} with strides {seen['gate']} "
                         f"(row-major would be ({seen['shape'][1]}, 1)); ")


def check_stage3(run: StageRunner) -> Outcome:
    if not run.gpu:
        return Outcome(3, None, "not observable: a CPU finishes each operation before the next "
                                "starts, so host clocks are exact there - the symptom needs a GPU")
    broken, fixed, msg = run.pair(3, ["--log-every", "1"])  # read the loss every step, as most scripts do
    if broken is None:
        return Outcome(3, False, f"the run failed: {msg}")
    return stage3_verdict(broken, fixed)


# A synchronised run accounts for nearly all of its step (the rest: zero_grad, the batch
# copy, host gaps); host clocks leave out the wait for the GPU, so their phases cover less.
# On a fast GPU the host launches barely ahead of it: the forward may look no faster at all
# (below the peak, near the synchronised rate) - the share of the step the phases lose is
# what shows reliably.
MISSING_SHARE = 0.05   # share of the step (5 points) the broken phases lose vs the fixed ones
FORWARD_TOO_FAST = 2.0  # broken forward rate vs the synchronised one: under half its time


def stage3_verdict(broken: dict, fixed: dict) -> Outcome:
    """Do the host-clock phases add up, and is their forward believable?

    Compared with the synchronised (--fixed) run of the same model, not with physics:
    ahead of a busy GPU the host gets only as far as its launching speed and the launch
    queue let it, so the forward looks no faster or somewhat faster than it is (below the
    peak), while the wait for the GPU falls outside every timed phase."""
    def coverage(r):  # how much of the step the three timed phases account for
        return sum(median(r, p) for p in ("forward", "backward", "optimizer")) / median(r, "step")

    def forward_tflops(r):
        cfg, run_ = ModelConfig(**r["config"]), r["run"]
        return flops.forward_flops(cfg, run_["batch_size"], run_["seq_len"]) / median(r, "forward") / 1e9

    lost = coverage(fixed) - coverage(broken)
    speedup = forward_tflops(broken) / forward_tflops(fixed)
    peak = broken["mfu"]["peak_tflops"]
    text = (f"phases cover {coverage(broken):.0%} of the step (fixed: {coverage(fixed):.0%}); "
            f"forward at {forward_tflops(broken):.3g} TFLOP/s (fixed: {forward_tflops(fixed):.3g}"
            f"{f', peak {peak:.0f}' if peak else ''})")
    findings = []
    if lost > MISSING_SHARE:
        findings.append(f"the phases account for {lost:.0%} less of the step than synchronised ones")
    if speedup > FORWARD_TOO_FAST:
        findings.append(f"forward {speedup:.2f}x the synchronised rate (under half its time)")
    if peak and forward_tflops(broken) > peak:
        findings.append("forward above the GPU's peak")
    return Outcome(3, bool(findings), text + (" -> " + "; ".join(findings) if findings else ""))


def check_stage4(run: StageRunner) -> Outcome:
    code, _, msg = run.run(4, [], "broken")
    _, skipped, _ = run.run(4, ["--skip-guard"], "no_guard")
    _, fixed, _ = run.run(4, ["--fixed"], "fixed")
    ratio = lambda r: median(r, "backward") / median(r, "forward")  # noqa: E731
    guard = msg.split(":", 2)[-1].split(" - ")[0].strip() if code == 5 else "did not fire"
    warned = any("faster than forward" in w for w in skipped["warnings"])
    return Outcome(4, code == 5,
                   f"exit {code} ({guard}); without the guard bwd/fwd = {ratio(skipped):.2f} "
                   f"(fixed: {ratio(fixed):.2f}){', harness warns backward < forward' if warned else ''}")


def check_stage5(run: StageRunner) -> Outcome:
    if importlib.import_module(STAGES[5][0]).triton is None:
        return Outcome(5, None, "skipped: triton is not installed")
    broken, fixed, msg = run.pair(5, run.interpreter_args())
    if broken is None:
        return Outcome(5, False, f"the run failed: {msg}")
    return compare_speed(5, run, broken, fixed, 1.0, "")


def compare_speed(stage: int, run: StageRunner, broken: dict, fixed: dict, threshold: float,
                  note: str) -> Outcome:
    """Correct but slow: on a GPU the fixed variant must be faster; in the interpreter
    (CPU) only the losses can be compared."""
    if not run.gpu:
        return Outcome(stage, None, f"{note}losses match fixed: {_same_losses(broken, fixed)}; the "
                                    f"interpreter's speed says nothing - the slowdown needs a GPU")
    ratio = tokens_per_s(fixed) / tokens_per_s(broken)
    return Outcome(stage, ratio > threshold,
                   f"{note}fixed is {ratio:.2f}x faster ({tokens_per_s(broken):,.0f} vs "
                   f"{tokens_per_s(fixed):,.0f} tok/s)")


def _same_losses(a: dict, b: dict) -> str:
    worst = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))
    return f"yes (max difference {worst:.1e})" if worst < 1e-2 else f"NO (max difference {worst:.2g})"


CHECKS = {1: check_stage1, 2: check_stage2, 3: check_stage3, 4: check_stage4, 5: check_stage5}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=int, nargs="+", choices=sorted(STAGES), default=sorted(STAGES))
    p.add_argument("--preset", default=None, help="model size (default: tiny on CPU, small on GPU)")
    p.add_argument("--num-steps", type=int, default=None,
                   help="steps per run (default 12 on CPU, 30 on GPU; interpreter stages use 3)")
    p.add_argument("--out-dir", default=None, help="keep the results JSON here (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="also print the outcomes as JSON")
    p.add_argument("--outcomes", metavar="FILE", help="also write the outcomes as JSON to FILE "
                   "(whole or not at all)")
    args = p.parse_args(argv)

    gpu = torch.cuda.is_available()
    steps = args.num_steps or (30 if gpu else 12)
    common_args = (["--preset", args.preset] if args.preset else []) + [
        "--num-steps", str(steps), "--warmup-steps", str(min(5 if gpu else 2, steps - 1))]
    with contextlib.ExitStack() as stack:
        out_dir = Path(args.out_dir) if args.out_dir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="perf_debugging_")))
        out_dir.mkdir(parents=True, exist_ok=True)
        runner = StageRunner(out_dir, common_args, gpu)
        print(f"performance debugging: {'GPU ' + torch.cuda.get_device_name(0) if gpu else 'CPU'}, "
              f"{' '.join(common_args)}")
        outcomes = []
        for stage in args.stages:
            outcome = CHECKS[stage](runner)
            outcomes.append(outcome)
            mark = {True: "TRIPPED", False: "MISSED", None: "n/a here"}[outcome.tripped]
            print(f"\nstage {stage}: {STAGES[stage][1]}\n  check:   {STAGES[stage][2]}\n"
                  f"  symptom: {outcome.symptom}\n  -> {mark}", flush=True)
    if args.json:
        print(json.dumps([o.__dict__ for o in outcomes], indent=2))
    if args.outcomes:
        write_json(args.outcomes, [o.__dict__ for o in outcomes], indent=1)
    return 1 if any(o.tripped is False for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
