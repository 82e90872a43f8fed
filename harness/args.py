"""Command-line parsing that keeps the workshop's promise: bad input is one line on
stderr and exit code 2, never argparse's usage dump; --help shows only real defaults.
Every command line of the project builds on these two classes."""
from __future__ import annotations

import argparse

from .errors import UsageError


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we promise exactly one line."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message} (see --help)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" only where there is a real default to show: not for
    switches (off unless given) nor for values the preset or device decides."""

    def _get_help_string(self, action):
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)
