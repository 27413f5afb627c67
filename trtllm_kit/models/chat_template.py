"""A tokenizer directory's chat template, found and rendered as Hugging Face tokenizers do, with ``jinja2`` alone.

Where the template is: ``chat_template.jinja`` when the directory has one, else ``tokenizer_config.json``'s
``chat_template`` (a string, or a list of ``{"name", "template"}`` of which ``default`` is used). How it is rendered
(the chat-templating contract templates are written against): a sandbox that refuses attribute tricks and keeps
the caller's data immutable, ``trim_blocks`` and ``lstrip_blocks`` on, ``break``/``continue`` in loops, the
``{% generation %}`` block rendered as its body, ``tojson`` without HTML escaping, ``raise_exception(message)`` and
``strftime_now(format)``; the template sees ``messages``, ``add_generation_prompt``, ``tools`` and ``documents``
(None) and each named special token (``bos_token``, ``eos_token``, ...) as a string.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jinja2

TEMPLATE_FILE = "chat_template.jinja"


class ChatTemplateError(ValueError):
    """The template refused the messages (its own ``raise_exception``, an undefined name, a sandbox violation)."""


def read_chat_template(directory: Path, config: dict[str, Any]) -> str | None:
    """The default chat template of a tokenizer directory, or None when it has none.

    Arguments:
        directory: the tokenizer directory; config: its ``tokenizer_config.json`` content (empty when absent).
    """
    path = directory / TEMPLATE_FILE
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


def render_chat(template: str, messages: list[dict[str, Any]], special_tokens: dict[str, str],
                add_generation_prompt: bool = True) -> str:
    """``messages`` through ``template``; ChatTemplateError says why the template refused them.

    Arguments:
        template: the chat template's source; messages: chat messages (``role``, ``content``);
        special_tokens: the named special tokens' text (``bos_token`` → ``<s>``); add_generation_prompt: end with
        the assistant's turn opened.
    """
    compiled = _compiled(template)
    try:
        return compiled.render(messages=messages, tools=None, documents=None,
                               add_generation_prompt=add_generation_prompt, **special_tokens)
    except Exception as exc:  # the template is the model's code: whatever it raises, it refused the messages
        raise ChatTemplateError(str(exc) or type(exc).__name__) from None


@lru_cache(maxsize=8)
def _compiled(template: str) -> jinja2.Template:
    import jinja2.ext
    import jinja2.sandbox

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` marks the assistant's text for training masks: its body."""

        tags = {"generation"}  # noqa: RUF012 (jinja2 reads the tags of the class)

        def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"it does not parse: {exc}") from None
