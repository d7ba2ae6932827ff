"""The ``--filter`` syntax of the command line: a Python-like condition, read into a pyarrow expression.

A condition compares columns with literals and combines the comparisons::

    lang == 'en' and n_chars >= 200
    lang in ('en', 'de') or not (score < 0.5)
    100 <= n_tokens < 4096
    title is not None

- comparisons: ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` between a column
  and a literal (a string, a number, ``True`` or ``False``), in either order,
  chained as in Python (``a < x < b``);
- ``x in (...)`` and ``x not in (...)`` with a tuple or list of literals (a null ``x`` is in
  neither: ``not in``, ``not (x in (...))`` and ``not (x not in (...))`` drop null rows, as
  ``!=`` does);
- ``x is None`` and ``x is not None``: null or not;
- ``and``, ``or``, ``not`` and parentheses;
- a column whose name is not a Python name: ``col("my column")``.

Nothing is evaluated as Python: the condition is parsed with :mod:`ast` and
only the forms above become a :class:`pyarrow.compute.Expression`; anything
else is refused, naming what and where.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

import pyarrow.compute as pc

__all__ = ["FilterSyntaxError", "parse_filter"]

_COMPARE: dict[type, Any] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
    ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_MIRROR: dict[type, type] = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE}
SYNTAX = (
    "comparisons of a column with a literal (==, !=, <, <=, >, >=), `x in (...)`, `x is None`, "
    "combined with and, or, not and parentheses; col(\"name\") for a name that is not a Python name"
)


class FilterSyntaxError(ValueError):
    """A ``--filter`` condition that is not in the syntax."""



def parse_filter(text: str) -> pc.Expression:
    """Return the pyarrow expression of a ``--filter`` condition.

    Raises
    ------
    FilterSyntaxError
        ``text`` is not in the syntax (the message names the part).

    Examples
    --------
    >>> str(parse_filter("lang == 'en' and n >= 3"))
    '((lang == "en") and (n >= 3))'
    >>> str(parse_filter("1 < n <= 5 or tag is None"))
    '(((n > 1) and (n <= 5)) or is_null(tag, {nan_is_null=false}))'
    >>> parse_filter("len(text) > 3")
    Traceback (most recent call last):
    ...
    arrowstream.cli.expressions.FilterSyntaxError: `len(text)` (at character 1) compares no column: ...
    """
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        # Python reports an incomplete condition ("n >") at column 0: it is the end that is missing
        where = f"at column {exc.offset}" if exc.offset else "at the end (something is missing)"
        raise FilterSyntaxError(f"{exc.msg} {where}: the syntax is {SYNTAX}") from exc
    return _condition(tree.body, text)


def _where(node: ast.AST, text: str) -> str:
    return f"`{ast.get_source_segment(text.strip(), node)}` (at character {getattr(node, 'col_offset', 0) + 1})"


def _condition(node: ast.AST, text: str, negate: bool = False) -> pc.Expression:
    """The expression of ``node`` (``negate``: of ``not node``).

    pyarrow's ``is_in`` is false, not null, for a null: ``~`` over it would
    keep null rows, where ``not (x == v)`` drops them. A ``not`` over a
    membership test is carried down to it instead (De Morgan's laws), so
    every form drops null rows as ``x != v`` does; any other ``not`` stays
    pyarrow's ``~`` (null for a null), so their expressions are unchanged.
    """
    if negate and not any(isinstance(n, (ast.In, ast.NotIn)) for n in ast.walk(node)):
        return ~_condition(node, text)
    if isinstance(node, ast.BoolOp):
        parts = [_condition(v, text, negate) for v in node.values]
        both = isinstance(node.op, ast.And) != negate  # not (a and b) is (not a) or (not b)
        out = parts[0]
        for part in parts[1:]:
            out = (out & part) if both else (out | part)
        return out
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _condition(node.operand, text, not negate)
    if isinstance(node, ast.Compare):
        out = None
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            term = _compare(left, op, right, text, negate)
            out = term if out is None else (out | term) if negate else (out & term)
            left = right
        assert out is not None
        return out
    raise FilterSyntaxError(f"{_where(node, text)} is not a condition: the syntax is {SYNTAX}")


def _compare(left: ast.AST, op: ast.cmpop, right: ast.AST, text: str, negate: bool = False) -> pc.Expression:
    if isinstance(op, (ast.Is, ast.IsNot)):
        if not (isinstance(right, ast.Constant) and right.value is None):
            raise FilterSyntaxError(f"{_where(right, text)}: `is` compares with None only")
        field = _column(left, text)
        return field.is_null() if isinstance(op, ast.Is) != negate else field.is_valid()
    if isinstance(op, (ast.In, ast.NotIn)):
        if not isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            raise FilterSyntaxError(f"{_where(right, text)}: `in` takes a tuple or list of literals")
        field = _column(left, text)
        member = field.isin([_literal(v, text) for v in right.elts])
        # is_in is false for a null, so `~` alone would keep null rows: `not in` drops them, as `!=` does
        return member if isinstance(op, ast.In) != negate else ~member & field.is_valid()
    if negate:
        return ~_compare(left, op, right, text)
    if type(op) not in _COMPARE:
        raise FilterSyntaxError(f"{_where(left, text)}: unsupported comparison: the syntax is {SYNTAX}")
    if _is_column(left):
        return _COMPARE[type(op)](_column(left, text), _literal(right, text))
    if _is_column(right):  # a literal on the left: mirror it
        mirrored = _MIRROR.get(type(op), type(op))
        return _COMPARE[mirrored](_column(right, text), _literal(left, text))
    raise FilterSyntaxError(f"{_where(left, text)} compares no column: the syntax is {SYNTAX}")


def _is_column(node: ast.AST) -> bool:
    named = isinstance(node, ast.Name) and node.id not in ("True", "False", "None")
    quoted = (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "col"
        and len(node.args) == 1 and not node.keywords
        and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
    )
    return named or quoted


def _column(node: ast.AST, text: str) -> pc.Expression:
    if isinstance(node, ast.Name) and _is_column(node):
        return pc.field(node.id)
    if _is_column(node):
        return pc.field(node.args[0].value)  # type: ignore[attr-defined]
    raise FilterSyntaxError(f"{_where(node, text)} is not a column: write a column name, or col(\"name\")")


def _literal(node: ast.AST, text: str) -> Any:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _literal(node.operand, text)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool)):
        return node.value
    raise FilterSyntaxError(f"{_where(node, text)} is not a literal (a string, a number, True or False)")
