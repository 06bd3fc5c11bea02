"""Generated fragments of the docs: the text between `<!-- SOURCE:KEY -->` and
`<!-- /SOURCE:KEY -->`, written by a command from the code, never by hand.

Two sources write them, each with its command and its test that the docs are what they render
to: `plan-docs` (planner/plan_docs.py: figures of stored `axtrain plan` reports;
tests/test_docs_plans.py) and `registry-docs` (planner/registry_docs.py: what the registries
hold: kinds, file endings, choices, defaults, allowed ranges, mesh entries;
tests/test_registry_docs.py). KEY is `KIND` or `KIND:ARG`: the source's FRAGMENTS[KIND]() or
FRAGMENTS[KIND](ARG) gives the text.
"""

from __future__ import annotations

import re
from typing import Callable


def pattern(source: str) -> re.Pattern:
  """Groups: 1 the opening marker, 2 its KEY, 3 the text, 4 the closing marker."""
  return re.compile(rf"(<!-- {source}:(\S+) -->)(.*?)(<!-- /{source}:\2 -->)", re.S)


def render(text: str, source: str, fragments: dict[str, Callable[..., str]], *,
           where: str) -> str:
  """`text` with every fragment of `source` rendered afresh by `fragments` (`where` names
  them in the error for an unknown kind)."""
  def one(m: re.Match) -> str:
    kind, _, arg = m[2].partition(":")
    if kind not in fragments:
      raise KeyError(f"no {source} fragment kind {kind!r} ({where})")
    return m[1] + (fragments[kind](arg) if arg else fragments[kind]()) + m[4]
  return pattern(source).sub(one, text)
