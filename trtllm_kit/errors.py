"""The kit's exceptions. The library raises them; only ``cli.py`` turns them into exit codes."""


class KitError(Exception):
    """An expected failure: the message is one sentence for the user (exit code 1)."""

    exit_code = 1


class KitUsageError(KitError):
    """The user asked for something that cannot be done as asked (exit code 2)."""

    exit_code = 2


class ModelError(KitUsageError):
    """The model the user named is missing, unsupported or refused (pickle, remote code)."""


class CheckpointError(KitError):
    """Weights on disk (HF input or TensorRT-LLM checkpoint) are incomplete, corrupt or do not match their config."""


class VerifyError(KitError):
    """A numerical check exceeded its tolerance."""
