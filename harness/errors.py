"""Errors with documented exit codes.

The command line turns each of these into ONE line on stderr and the exit code
below - never a traceback, never a half-written results file.

    0  success
    2  bad input: invalid flag, config, shape, precision or device
    3  out of memory, or a CPU run predicted not to fit this machine's memory
       (the message says the peak reached or predicted, and what to try)
    4  the loss became NaN or infinite (the message names the step)
    5  gradient-flow guard: some parameters received no (finite, non-zero) gradient
"""


class WorkshopError(Exception):
    exit_code = 1


class UsageError(WorkshopError):
    exit_code = 2


class OutOfMemory(WorkshopError):
    exit_code = 3


class NonFiniteLoss(WorkshopError):
    exit_code = 4


class GradientFlowError(WorkshopError):
    exit_code = 5


EXIT_CODES = {0: "success", 2: "bad input", 3: "out of memory", 4: "non-finite loss",
              5: "gradient-flow guard failed"}
