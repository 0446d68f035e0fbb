"""Pieces shared by resnmt's command-line tools."""
import argparse


class OneLineErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (exit status 2), naming the
    bad value, instead of the usage block followed by the message."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
