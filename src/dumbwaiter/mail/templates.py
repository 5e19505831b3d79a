"""Jinja2 templates for the subject, the text body and the html body.

A template named ``welcome`` is up to three templates: ``welcome.subject.txt``
(required), ``welcome.txt`` and ``welcome.html`` (at least one of them).
They come from a directory, or from strings:

    Templates("templates/mail")
    Templates({"welcome": {"subject": "Hi {{ name }}", "text": "...", "html": "..."}})

The html template is autoescaped (a user's name cannot inject markup); the
subject and text are not (they are not html).  Undefined variables are
errors, not blanks: a mail missing its order number fails at the call that
composed it, not in a customer's inbox.  Rendering happens when the mail is
composed, so the job carries the finished text and a template edited
between enqueue and send cannot change what was promised.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import TemplateError

try:
    import jinja2
except ImportError as exc:  # pragma: no cover - the extra is missing
    from ..errors import MissingDependency

    raise MissingDependency(
        "mail templates need jinja2, which is not installed: pip install 'dumbwaiter[mail]'"
    ) from exc

#: the parts of a template and the file suffix each is stored under
PARTS = {"subject": ".subject.txt", "text": ".txt", "html": ".html"}


@dataclass(frozen=True, slots=True)
class Rendered:
    subject: str
    text: str | None
    html: str | None


class Templates:
    """A set of mail templates (see the module doc for the layout)."""

    def __init__(
        self,
        source: str | os.PathLike[str] | Mapping[str, Mapping[str, str]],
        *,
        filters: Mapping[str, Callable[..., Any]] | None = None,
        globals: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(source, str | os.PathLike):
            if not os.path.isdir(source):
                raise TemplateError(f"mail template directory {os.fspath(source)!r} does not exist")
            loader: jinja2.BaseLoader = jinja2.FileSystemLoader(os.fspath(source))
        elif isinstance(source, Mapping):
            loader = jinja2.DictLoader(_flatten(source))
        else:
            raise TemplateError(
                f"Templates takes a directory or a dict of templates, got {source!r}"
            )
        self.env = jinja2.Environment(
            loader=loader,
            autoescape=jinja2.select_autoescape(
                enabled_extensions=("html", "htm"), default_for_string=False, default=False
            ),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
        )
        self.env.filters.update(filters or {})
        self.env.globals.update(globals or {})

    def render(self, name: str, context: Mapping[str, Any]) -> Rendered:
        """The subject and bodies of template ``name`` rendered with ``context``."""
        parts: dict[str, str | None] = {}
        for part, suffix in PARTS.items():
            try:
                template = self.env.get_template(name + suffix)
            except jinja2.TemplateNotFound:
                parts[part] = None
                continue
            except jinja2.TemplateError as exc:
                raise TemplateError(f"mail template {name + suffix}: {exc}") from exc
            try:
                parts[part] = template.render(context)
            except jinja2.TemplateError as exc:
                raise TemplateError(f"mail template {name + suffix}: {exc}") from exc
        if parts["subject"] is None:
            raise TemplateError(f"mail template {name!r} has no subject ({name}.subject.txt)")
        if parts["text"] is None and parts["html"] is None:
            raise TemplateError(
                f"mail template {name!r} has no body: give {name}.txt, {name}.html or both"
            )
        return Rendered(parts["subject"] or "", parts["text"], parts["html"])


def _flatten(source: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, parts in source.items():
        if not isinstance(parts, Mapping):
            raise TemplateError(
                f"template {name!r}: give a dict of parts (subject, text, html), got {parts!r}"
            )
        unknown = set(parts) - set(PARTS)
        if unknown:
            raise TemplateError(
                f"template {name!r}: unknown part(s) {sorted(unknown)}; parts are {list(PARTS)}"
            )
        for part, text in parts.items():
            out[name + PARTS[part]] = text
    return out
