"""The read-only guard's pieces (aggregator/sink/guard.py): reading EXPLAIN AST's tree back
exactly, and the function catalog's decisions, on the real engine's catalog (chdb).

The guard end to end, through a real worker: tests/aggregator/test_worker_pages.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aggregator.sink.errors import QueryRefused
from aggregator.sink.explain_tree import parse_tree
from aggregator.sink.guard import READ_ONLY_SESSION, FunctionCatalog, QueryGuard
from aggregator.sink.store import open_client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FunctionCatalog]:
    """The engine's own catalog, read by a guard as /sql reads it (one chdb path, closed)."""
    dsn = f"chdb://{tmp_path_factory.mktemp('guard')}/data"
    keep = open_client(dsn)
    guard = QueryGuard(lambda: open_client(dsn, **READ_ONLY_SESSION))
    yield guard.catalog
    guard.client.close()
    keep.close()


@pytest.mark.parametrize(
    "name",
    [
        "sum",
        "COUNT",  # case-insensitive in the engine
        "sumIf",
        "uniqExactState",
        "sumArrayIf",  # two combinators
        "argMax",
        "toDecimal128",
        "DAY",  # an alias of toDayOfMonth
        "toStartOfMonth",
        "arrayMap",
        "JSONExtractString",
        "domain",  # URL category: string work on a URL, no fetch
        "in",
        "lambda",
        "formatReadableSize",
        "row_number",
    ],
)
def test_functions_that_compute_on_values_are_allowed(catalog: FunctionCatalog, name: str) -> None:
    assert catalog.allows(name)


@pytest.mark.parametrize(
    "name",
    [
        "file",  # the scalar file(): 'Other'
        "FILE",  # not a case-insensitive function: unknown as written
        "url",  # a table function only
        "dictGet",
        "joinGet",
        "sleep",
        "getSetting",
        "hostName",
        "aiGenerate",
        "AIGenerate",  # an alias of aiGenerate
        "addressToSymbol",
        "naiveBayesClassifier",
        "no_such_function",
        "fileIf",  # a combinator on something that is not an allowed aggregate
        "sleepState",
    ],
)
def test_everything_else_is_refused(catalog: FunctionCatalog, name: str) -> None:
    assert not catalog.allows(name)


def test_a_catalog_without_categories_allows_only_the_reviewed_extras() -> None:
    old_server = FunctionCatalog([("sum", "", "", 1, 1), ("file", "", "", 0, 0)], ["If"])
    assert not old_server.allows("sum") and not old_server.allows("sumIf")
    assert not old_server.allows("file")
    assert old_server.allows("lambda")


TREE = [
    "SelectWithUnionQuery (children 2)",
    " ExpressionList (children 1)",
    "  SelectQuery (children 1)",
    "   ExpressionList (children 1)",
    "    Function file (alias f) (children 1)",
    "     ExpressionList (children 1)",
    "      Literal '/etc/hostname'",
    " Identifier Native",
]


def test_the_tree_reads_back_with_names_aliases_and_counts() -> None:
    root = parse_tree(TREE)
    assert root.kind == "SelectWithUnionQuery" and len(root.children) == 2
    function = root.children[0].children[0].children[0].children[0]
    assert (function.kind, function.name) == ("Function", "file")
    assert root.children[1].name == "Native"


@pytest.mark.parametrize(
    "lines",
    [
        # a line printed by a quoted alias holding a line break: counts no longer match
        [*TREE[:4], "    Literal 'x' (alias a", "  Function url) (children 1)", *TREE[4:]],
        [*TREE[:6], TREE[6] + " (children 2)", *TREE[7:]],  # declared children missing
        [TREE[0], "   ExpressionList (children 1)", *TREE[2:]],  # a depth skipped
        [*TREE, "Identifier Native"],  # two roots
        [],
        ["  SelectWithUnionQuery"],  # a root that is indented
    ],
)
def test_a_tree_that_does_not_read_back_exactly_is_refused(lines: list[str]) -> None:
    with pytest.raises(QueryRefused) as raised:
        parse_tree(lines)
    assert raised.value.reason == "unreadable"
