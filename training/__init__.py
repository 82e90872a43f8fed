"""The run layer of the workshop, built on harness/: one command line for every version
(cli.py), the training loop (trainer.py), data parallelism (parallel.py) and
`make workshop` (workshop.py). A version file hands `training.main` its model builder;
everything else about a run is decided here, the same for every version. A profiled
run uses profiling/ (the in-loop sessions), which builds on harness/ alone."""
from .cli import main

__all__ = ["main"]
