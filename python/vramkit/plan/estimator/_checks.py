"""Checks that only raise: the answer that passes a validity check on a tensor's values.

Models check their inputs' values before they use them: transformers' Wav2Vec2 and HuBERT
raise ``ValueError`` when a CTC label is past the vocabulary (``if labels.max() >=
vocab_size: raise ...``), other code asserts that indices are in range. Under fake tensors
the test has no value and the estimate would stop there, though a valid step passes the
check and what it allocates does not depend on it: a check whose failure can only raise
decides nothing about a healthy step's memory.

:func:`passing_answer` reads the source of the line that tests a tensor's truth (the
innermost frame outside PyTorch and vramkit) and, when that test is in the condition of an
``if`` with no ``else`` whose body ends by raising (``raise``, ``torch._assert(False, ...)``,
after statements that only make the message), or of an ``assert`` (with
``and``, ``or`` and ``not`` among its tests), gives the truth value that lets the step go
on. Anything else (an ``if`` that does something besides raising, two tests on one line
that pass on different answers, a line whose source cannot be read) gives None, and the
read is refused as before.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap


def passing_answer(frame) -> bool | None:
    """The truth value that passes the raise-only check ``frame`` is testing, else None."""
    line = frame.f_lineno if frame is not None else None
    if line is None:    # no frame outside PyTorch and vramkit, or no line for it
        return None
    answers = {answer for lo, hi, answer in _raise_only_tests(frame.f_code) if lo <= line <= hi}
    # Two tests on one line that pass on different answers cannot be told apart by line.
    return answers.pop() if len(answers) == 1 else None


@functools.lru_cache(maxsize=256)
def _raise_only_tests(code) -> tuple:
    """(first line, last line, passing answer) of each truth test in the raise-only checks
    of ``code``'s function, in the file's line numbers; () where the source cannot be
    read."""
    try:
        lines, start = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return ()
    offset = max(start, 1) - 1
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and not node.orelse and _always_raises(node.body):
            _tests(node.test, False, offset, found)     # false, or the step raises
        elif isinstance(node, ast.Assert):
            _tests(node.test, True, offset, found)      # true, or the assertion fails
    return tuple(found)


def _always_raises(body: list) -> bool:
    """Whether a block ends by raising whatever it does first: its last statement is a
    ``raise`` or ``torch._assert(False, ...)`` (torchvision's), and nothing in it can
    leave before (no ``return``, ``break``, ``continue`` or ``yield``): the statements
    before only make the message."""
    last = body[-1]
    if isinstance(last, ast.Raise) and _ends_iteration(last):
        return False    # the way a loop ends, not a failure: answering it would loop on
    fails = isinstance(last, ast.Raise) or (
        isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
        and _called_name(last.value.func) == "_assert" and last.value.args
        and isinstance(last.value.args[0], ast.Constant) and last.value.args[0].value is False)
    leaves = (ast.Return, ast.Break, ast.Continue, ast.Yield, ast.YieldFrom)
    return fails and not any(isinstance(n, leaves) for stmt in body for n in ast.walk(stmt))


def _ends_iteration(node: ast.Raise) -> bool:
    raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return _called_name(raised) in ("StopIteration", "StopAsyncIteration")


def _called_name(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _tests(expr, want: bool, offset: int, found: list) -> None:
    """The truth tests Python makes to evaluate ``expr``, each with the answer that gives
    ``expr`` the truth value ``want``. Under ``and`` and ``or`` every operand answering
    ``want`` gives the whole ``want`` (short-circuit included); ``not`` turns it."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        _tests(expr.operand, not want, offset, found)
    elif isinstance(expr, ast.BoolOp):
        for value in expr.values:
            _tests(value, want, offset, found)
    else:
        found.append((expr.lineno + offset, expr.end_lineno + offset, want))
