"""The kit's exceptions. The library raises them; only ``cli.py`` turns them into exit codes."""


class KitError(Exception):
    """An expected failure: the message is one sentence for the user (exit code 1)."""

    exit_code = 1


class KitUsageError(KitError):
    """The user asked for something that cannot be done as asked (exit code 2)."""

    exit_code = 2


class ModelError(KitUsageError):
    """The model input is missing, unsupported or malformed."""


class CheckpointError(KitError):
    """A checkpoint on disk is incomplete, corrupt or does not match its config."""


class VerifyError(KitError):
    """A numerical check exceeded its tolerance."""
