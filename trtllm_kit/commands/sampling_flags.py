"""``generate``'s sampling flags, generated from the generation request's rows: one per scalar field that both an
OpenAI body and the text interface (``ensemble``, ``tensorrt_llm_bls``) carry, with the row's help, and its rule's
kind as the flag's type.

The rows are read when the command parses or shows its help, not when the CLI starts (the wire imports numpy), so
``trtllm-kit --help`` stays quick.
"""

from __future__ import annotations

from typing import Any

import click


def sampling_options(taken: set[str]) -> list[click.Option]:
    """A flag per sampling field the text interface and an OpenAI body carry, unset by default.

    Arguments:
        taken: parameter names the command declares itself (their rows get no generated flag).
    """
    from trtllm_kit.wire.fields import rows
    from trtllm_kit.wire.request import GenerationRequest

    return [click.Option([f"--{row.name.replace('_', '-')}", row.name], type=row.wire.rule.kind,
                         help=row.wire.help)
            for row in rows(GenerationRequest)
            if row.is_scalar and row.openai and row.tensor("text") and row.wire.rule is not None
            and row.name not in taken]


class SamplingCommand(click.Command):
    """A command whose callback also takes the sampling flags (``sampling_options``), as keywords by field name."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._has_sampling = False

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        if not self._has_sampling:
            self.params.extend(sampling_options({str(p.name) for p in self.params}))
            self._has_sampling = True
        return super().get_params(ctx)
