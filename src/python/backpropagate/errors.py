"""Exceptions: one class per category of backprop's error catalog (src/core/error_catalog.inc).

Every error the library raises is a :class:`BackpropError` with the catalog's code, the message
with its real numbers, the suggestion, whether retrying can help, the details and the run id (as
``backprop --json`` prints them). The subclasses are made from the catalog when the package is
imported, not listed by hand: one per category (``ConfigError``, ``InputError``,
``DependencyError``, ``BackpropRuntimeError``, ``StateError``; a name Python's builtins already use
gets the ``Backprop`` prefix), and :class:`OutOfMemoryError` under the runtime class for the
out-of-memory codes (``RUNTIME_CPU_OOM``, ``RUNTIME_GPU_OOM``, ``RUNTIME_OOM_ADJACENT``,
``RUNTIME_OOM_RECOVERY_EXHAUSTED``).
"""

import builtins
import re

from . import _core

__all__ = ["BackpropError", "OutOfMemoryError", "CATALOG", "error_class"]


class BackpropError(Exception):
    """An error of backprop's catalog.

    Attributes: ``code`` (``"CONFIG_INVALID_SETTING"``), ``message``, ``suggestion``,
    ``retryable`` (``"yes"``, ``"no"`` or ``"sometimes"``), ``details`` (a dict with the numbers
    and names involved), ``run_id`` (``None`` when no run had started), ``category``.
    """

    def __init__(self, code, message, suggestion="", retryable="no", details=None, run_id=None, category=""):
        super().__init__(message)
        self.code = code
        self.message = message
        self.suggestion = suggestion
        self.retryable = retryable
        self.details = details or {}
        self.run_id = run_id
        self.category = category

    def __str__(self):
        text = f"[{self.code}] {self.message}"
        if self.run_id:
            text += f"\nRun id: {self.run_id}"
        if self.suggestion:
            text += f"\nSuggestion: {self.suggestion}"
        return text


CATALOG = {row["code"]: row for row in _core.error_catalog()}

_OOM_CODE = re.compile(r"^RUNTIME_(.*_)?OOM(_.*)?$")


def _class_name(category):
    name = category.capitalize() + "Error"
    return "Backprop" + name if hasattr(builtins, name) else name


def _make_classes():
    classes = {}
    for row in CATALOG.values():
        category = row["category"]
        if category in classes:
            continue
        name = _class_name(category)
        doc = f"Errors of the catalog's {category!r} category: " + ", ".join(
            c for c, r in CATALOG.items() if r["category"] == category
        )
        classes[category] = type(name, (BackpropError,), {"__doc__": doc, "__module__": __name__})
    return classes


_CATEGORY_CLASSES = _make_classes()
globals().update({cls.__name__: cls for cls in _CATEGORY_CLASSES.values()})
__all__ += [cls.__name__ for cls in _CATEGORY_CLASSES.values()]

OutOfMemoryError = type(
    "OutOfMemoryError",
    (_CATEGORY_CLASSES["runtime"],),
    {
        "__doc__": "Out of memory: " + ", ".join(c for c in CATALOG if _OOM_CODE.match(c)),
        "__module__": __name__,
    },
)


def error_class(code):
    """The exception class raised for a catalog code."""
    if _OOM_CODE.match(code):
        return OutOfMemoryError
    row = CATALOG.get(code)
    return _CATEGORY_CLASSES[row["category"]] if row else BackpropError


def _from_envelope(env):
    """The exception for the library's error envelope (render_error_json, plus the category)."""
    code = env.get("code", "RUNTIME_INTERNAL")
    return error_class(code)(
        code,
        env.get("message", ""),
        suggestion=env.get("suggestion") or "",
        retryable=env.get("retryable", "no"),
        details=env.get("details") or {},
        run_id=env.get("run_id") or None,
        category=env.get("category", ""),
    )


_core.set_error_factory(_from_envelope)
