"""The read-only guard of analyst queries (the worker's ``/sql`` page).

Two layers, both the engine's own, and the engine's process behind a wall of its own:

1. **Its parser, never ours.** The analyst's text reaches the engine only as a value:
   ``SELECT formatQuery(unhex({sql:String}))`` parses it (one statement, or the engine
   refuses: "Multi-statements are not allowed") and prints it back in the engine's own
   form, comments dropped, every literal and name quoted and escaped. That
   re-serialisation, a fixed point of formatQuery, is what is vetted and what runs: the
   client's text itself never does (the scanner this replaced split statements its own
   way and missed ``#`` comments and ``$$`` strings, so a hidden second statement ran).
   ``EXPLAIN AST <canonical>`` gives the tree, checked against allowlists: the statement
   is a query (``SELECT``, ``WITH ... SELECT``, ``UNION``/``EXCEPT`` of them,
   ``DESCRIBE``, ``SHOW TABLES``) made of known kinds of node only; no ``INTO OUTFILE``,
   ``FORMAT`` or ``SETTINGS`` on any of them; every table function is one that makes
   rows from nothing (``numbers``, ``values``, ...) or one of the schema's parameterized
   views (``budget_history_of``); every other function, anywhere in
   the tree (subqueries, CTEs, JOINs, ``IN (...)``), is one whose engine category
   computes on values (arithmetic, strings, dates, aggregates, ...) or one of a few
   reviewed extras. Everything else is refused, including what this list has never
   heard of: ``file()``, ``url()``, ``remote()``, ``s3()``, ``executable()``,
   ``input()``, dictionaries, introspection, the AI functions.
2. **Its read-only mode and limits.** The statement runs on a client whose session has
   :data:`READ_ONLY_SESSION`: bounded time, memory and answer, then ``readonly=1``, set
   last, so no query can lift them.

The second wall does not depend on either: an embedded store's engine runs in a process
of its own that cannot open a file outside the store, and that the worker kills when a
query outlives its time limit (``aggregator/sink/engine_host.py``).

The tree is read from EXPLAIN AST's text (``explain_tree.py``); a tree that does not
read back exactly, or a function name that is not a plain identifier, is refused
rather than guessed.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any, Final

from clickhouse_connect.driver.client import Client

from aggregator.sink.errors import QueryRefused, SinkError, translate
from aggregator.sink.explain_tree import Node, parse_tree, unreadable
from aggregator.sink.query import run_query

#: the statements /sql runs (EXPLAIN AST's name of each)
STATEMENTS: Final = frozenset({"SelectWithUnionQuery", "DescribeQuery", "ShowTables"})

#: the nodes a query may hold (EXPLAIN AST's names); anything else is refused, e.g.
#: ``* APPLY(f)`` (ColumnsApplyTransformer names its function where no Function node shows it)
NODE_KINDS: Final = frozenset(
    {
        *STATEMENTS,
        "SelectIntersectExceptQuery",
        "SelectQuery",
        "ExpressionList",
        "Identifier",
        "TableIdentifier",
        "Literal",
        "Function",
        "Asterisk",
        "QualifiedAsterisk",
        "ColumnsRegexpMatcher",
        "ColumnsListMatcher",
        "QualifiedColumnsRegexpMatcher",
        "QualifiedColumnsListMatcher",
        "ColumnsTransformerList",
        "ColumnsExceptTransformer",
        "TablesInSelectQuery",
        "TablesInSelectQueryElement",
        "TableExpression",
        "TableJoin",
        "ArrayJoin",
        "Subquery",
        "WithElement",
        "OrderByElement",
        "InterpolateElement",
        "WindowDefinition",
        "WindowListElement",
        "SampleRatio",
    }
)

#: table functions that make rows out of their arguments alone (``view`` wraps a
#: subquery, which is checked like any other)
TABLE_FUNCTIONS: Final = frozenset(
    {
        "numbers",
        "numbers_mt",
        "zeros",
        "zeros_mt",
        "values",
        "generate_series",
        "generateSeries",
        "primes",
        "null",
        "view",
    }
)

#: the shipped schema's parameterized views (ddl/014): called like table functions, they
#: read the store's own tables, as a plain view does
PARAMETERIZED_VIEWS: Final = frozenset({"budget_history_of"})

#: the engine's function categories (system.functions.categories) that compute on the
#: values they are given; 'Other', 'Internal', 'Introspection', 'Dictionary', 'AI',
#: 'Machine Learning', uncategorised names... are not among them
FUNCTION_CATEGORIES: Final = frozenset(
    {
        "Aggregate Functions",
        "Arithmetic",
        "Arrays",
        "Bit",
        "Bitmap",
        "Comparison",
        "Conditional",
        "Dates and Times",
        "Distance",
        "Encoding",
        "Financial",
        "Geo",
        "Geo Polygon",
        "Hash",
        "IP Address",
        "JSON",
        "Logical",
        "Map",
        "Mathematical",
        "Null",
        "Random Number",
        "Rounding",
        "String",
        "String Replacement",
        "String Search",
        "String Splitting",
        "Time Window",
        "Tuple",
        "Type Conversion",
        "URL",
        "UUID",
    }
)

#: reviewed names outside those categories: syntax the parser writes as functions
#: (lambda, EXISTS, GROUPING, CASE x WHEN, ::, count(DISTINCT)) and value-only helpers
EXTRA_FUNCTIONS: Final = frozenset(
    {
        "lambda",
        "exists",
        "grouping",
        "caseWithExpression",
        "_CAST",
        "countDistinct",
        "materialize",
        "identity",
        "ignore",
        "toTypeName",
        "toColumnTypeName",
        "transform",
        "bar",
        "finalizeAggregation",
        "runningDifference",
        "runningDifferenceStartingWithFirstValue",
        "neighbor",
        "formatReadableSize",
        "formatReadableDecimalSize",
        "formatReadableQuantity",
        "formatReadableTimeDelta",
        "parseReadableSize",
        "parseReadableSizeOrNull",
        "parseReadableSizeOrZero",
        "parseTimeDelta",
        "currentDatabase",
        "version",
    }
)

#: the output format clickhouse-connect appends to every query it sends
CLIENT_FORMAT: Final = "Native"

_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: ClickHouse's READONLY error code: the engine's read-only mode refused the statement
READONLY_CODE: Final = 164
#: TIMEOUT_EXCEEDED, TOO_MANY_ROWS_OR_BYTES, MEMORY_LIMIT_EXCEEDED: past the session's limits
LIMIT_CODES: Final = frozenset({159, 396, 241})

#: the session settings of the guard's client: bounded queries (one analyst must not hold
#: the engine, which the sink shares, for long, nor its memory, nor the worker's with a
#: huge answer), then readonly=1, LAST: once it is set, no setting can change.
#: ``max_execution_time`` is the engine's own check; the engine's process is killed when
#: a query outlives it by :data:`KILL_GRACE_SECONDS` (engine_host.py).
READ_ONLY_SESSION: Final[dict[str, Any]] = {
    "max_execution_time": 30,
    "max_result_rows": 100_000,
    "max_result_bytes": 64 * 1024 * 1024,
    "max_memory_usage": 2 * 1024 * 1024 * 1024,
    "max_query_size": 256 * 1024,
    "max_ast_elements": 50_000,
    "readonly": 1,
}
#: seconds past max_execution_time after which the engine's process is killed
KILL_GRACE_SECONDS: Final = 5.0
#: how the engine refuses a request of several statements (formatQuery's syntax error)
_MULTI_STATEMENT: Final = "Multi-statements are not allowed"
_EMPTY_QUERY: Final = "Empty query"
#: the clauses that would make the engine's client write a file or change the session:
#: formatQuery prints each at the start of a line (literals never hold a line break there)
_REFUSED_CLAUSES: Final = re.compile(r"^\s*(INTO\s+OUTFILE|FORMAT|SETTINGS)\b", re.MULTILINE)


class FunctionCatalog:
    """Which function names the guard allows, from the engine's own system.functions."""

    def __init__(
        self,
        functions: list[tuple[str, str, str, int, int]],
        combinators: list[str],
    ) -> None:
        # name -> (alias_to, categories, is_aggregate); case-insensitive names also lower()
        self._exact: dict[str, tuple[str, frozenset[str], bool]] = {}
        self._folded: dict[str, tuple[str, frozenset[str], bool]] = {}
        for name, alias_to, categories, case_insensitive, is_aggregate in functions:
            entry = (
                alias_to,
                frozenset(c.strip() for c in categories.split(",") if c.strip()),
                bool(is_aggregate),
            )
            self._exact[name] = entry
            if case_insensitive:
                self._folded[name.lower()] = entry
        # longest first: "SimpleState" before "State"
        self._combinators = sorted(combinators, key=len, reverse=True)

    @classmethod
    def load(cls, client: Client) -> FunctionCatalog:
        try:
            functions = client.query(
                "SELECT name, alias_to, categories, case_insensitive, is_aggregate "
                "FROM system.functions"
            ).result_rows
            combinators = client.query(
                "SELECT name FROM system.aggregate_function_combinators"
            ).result_rows
        except Exception as exc:  # a server without categories cannot be vetted
            raise translate(exc, "reading the engine's function catalog for /sql") from exc
        return cls([tuple(row) for row in functions], [row[0] for row in combinators])

    def _entry(self, name: str) -> tuple[str, frozenset[str], bool] | None:
        return self._exact.get(name) or self._folded.get(name.lower())

    def _resolved(self, name: str) -> tuple[str, frozenset[str], bool] | None:
        entry = self._entry(name)
        for _ in range(4):  # alias -> its function (aliases name functions, not aliases)
            if entry is None or not entry[0]:
                return entry
            entry = self._entry(entry[0])
        return None

    def allows(self, name: str) -> bool:
        if name in EXTRA_FUNCTIONS:
            return True
        entry = self._resolved(name)
        if entry is not None:
            return bool(entry[1]) and entry[1] <= FUNCTION_CATEGORIES
        return self._combined_aggregate(name)

    def _combined_aggregate(self, name: str) -> bool:
        """``sumIf``, ``uniqExactState``, ``sumArrayIf``...: an allowed aggregate + combinators."""
        for suffix in self._combinators:
            if len(name) > len(suffix) and name.endswith(suffix):
                base = name[: -len(suffix)]
                entry = self._resolved(base)
                if entry is not None:
                    if entry[2] and entry[1] <= FUNCTION_CATEGORIES and entry[1]:
                        return True
                elif self._combined_aggregate(base):
                    return True
        return False


class QueryGuard:
    """Vets and runs analyst queries on a client ``connect()`` opens (with
    :data:`READ_ONLY_SESSION`).

    A query the engine fails (a limit, a syntax error) costs the client: chdb 26.9 can
    hand the rest of a cancelled query's rows to the next query on the same connection
    (seen with ``SELECT * FROM system.numbers`` past ``max_result_rows``), so the next
    query gets a fresh one. Not thread-safe: the caller serialises calls.
    """

    def __init__(self, connect: Callable[[], Client]) -> None:
        self._connect = connect
        self._client: Client | None = None
        self._catalog: FunctionCatalog | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self._connect()
        return self._client

    def _discard_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    @property
    def catalog(self) -> FunctionCatalog:
        """The engine's function catalog, read once (the first query pays for it)."""
        if self._catalog is None:
            self._catalog = FunctionCatalog.load(self.client)
        return self._catalog

    def vet(self, sql: Any) -> str:
        """The engine's own form of the one statement in ``sql``, once its tree passes;
        QueryRefused if not.

        Raises SinkRejected for a statement the engine cannot parse (the analyst's error).
        """
        if not isinstance(sql, str):
            raise QueryRefused('"sql" must be a string', reason="bad_request")
        canonical = self._canonical(sql)
        if self._canonical(canonical) != canonical:  # a fixed point, or not understood
            raise unreadable()
        clause = _REFUSED_CLAUSES.search(canonical)
        if clause is not None:
            raise _clause_refused(clause.group(1).split()[0].upper())
        try:
            lines = [row[0] for row in self.client.query(f"EXPLAIN AST {canonical}").result_rows]
        except Exception as exc:
            self._discard_client()
            raise _refused_by_engine(exc, "parsing the query") from exc
        tree = parse_tree(lines)
        _check_statement(tree, canonical)
        _check_nodes(tree, None, self.catalog)
        return canonical

    def _canonical(self, sql: str) -> str:
        """``sql`` parsed and printed back by the engine, handed over as a value (hex, so
        no quoting of ours is involved); QueryRefused for none or several statements."""
        try:
            rows = self.client.query(
                "SELECT formatQuery(unhex({sql:String}))",
                parameters={"sql": sql.encode("utf-8", "surrogatepass").hex()},
            ).result_rows
        except Exception as exc:
            self._discard_client()
            text = str(exc)
            if _MULTI_STATEMENT in text:
                raise QueryRefused(
                    "several statements in one request: send one query at a time",
                    reason="multiple_statements",
                ) from exc
            if _EMPTY_QUERY in text:
                raise QueryRefused("no statement in the request", reason="empty") from exc
            raise _refused_by_engine(exc, "parsing the query") from exc
        canonical = rows[0][0] if rows and rows[0] else None
        if not isinstance(canonical, str) or not canonical.strip():
            raise QueryRefused("no statement in the request", reason="empty")
        return canonical

    def run(self, sql: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Vet ``sql`` and run it read-only: (column names, rows)."""
        statement = self.vet(sql)
        try:
            return run_query(self.client, statement)
        except SinkError as exc:
            self._discard_client()
            raise _refused_by_engine(exc.__cause__ or exc, "running the query") from exc


def _refused_by_engine(exc: BaseException, doing: str) -> SinkError:
    """QueryRefused when the engine's read-only mode or its limits refused, else the usual
    sink error."""
    code = getattr(exc, "code", None)
    if code in LIMIT_CODES or getattr(exc, "killed", False):
        limits = ", ".join(f"{k}={v}" for k, v in READ_ONLY_SESSION.items() if k != "readonly")
        return QueryRefused(
            f"the query went past /sql's limits ({limits}): {_first_line(exc)}; "
            "aggregate in the query, or ask the store directly",
            reason="limit",
        )
    if code == READONLY_CODE:
        return QueryRefused(
            f"refused by the engine's read-only mode ({_first_line(exc)}): /sql runs "
            "plain queries without SETTINGS",
            reason="read_only",
        )
    return translate(exc, doing)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _clause_refused(keyword: str) -> QueryRefused:
    if keyword == "INTO":
        return QueryRefused("INTO OUTFILE is refused: /sql returns rows", reason="into_outfile")
    if keyword == "FORMAT":
        return QueryRefused("FORMAT is refused: /sql returns JSON", reason="format")
    return QueryRefused("SETTINGS clauses are refused in /sql", reason="settings")


def _check_statement(tree: Node, statement: str) -> None:
    if tree.kind not in STATEMENTS:
        keyword = statement.split(None, 1)[0].upper() if statement.split() else tree.kind
        raise QueryRefused(
            f"{keyword} statements are refused: /sql runs SELECT (WITH ..., UNION ...), "
            "DESCRIBE and SHOW TABLES only, read-only",
            reason="statement",
        )
    # every statement kind's own output clauses hang from its top node: INTO OUTFILE (a
    # literal), FORMAT (an identifier; clickhouse-connect appends Native); a SELECT's
    # body is an ExpressionList, a DESCRIBE's its TableExpression, SHOW TABLES' LIKE is
    # no node
    for child in tree.children:
        if child.kind == "Literal":
            raise _clause_refused("INTO")
        if child.kind == "Identifier" and child.name != CLIENT_FORMAT:
            raise QueryRefused(
                f"FORMAT {child.name} is refused: /sql returns JSON", reason="format"
            )


def _check_nodes(node: Node, parent: Node | None, catalog: FunctionCatalog) -> None:
    if node.kind == "Set":
        raise QueryRefused("SETTINGS clauses are refused in /sql", reason="settings")
    if node.kind not in NODE_KINDS:
        raise QueryRefused(
            f"the query holds a {node.kind} node, which /sql does not allow",
            reason="syntax",
        )
    if node.kind == "Function":
        name = node.name
        if _NAME.fullmatch(name) is None:
            raise unreadable()
        if parent is not None and parent.kind == "TableExpression":
            if name not in TABLE_FUNCTIONS and name not in PARAMETERIZED_VIEWS:
                raise QueryRefused(
                    f"table function {name}() is refused: /sql reads the store's tables "
                    f"only (allowed: {', '.join(sorted(TABLE_FUNCTIONS))})",
                    reason="table_function",
                )
        elif not catalog.allows(name):
            raise QueryRefused(
                f"function {name}() is refused: /sql allows functions that compute on "
                "values (no files, hosts, processes, dictionaries or server internals)",
                reason="function",
            )
    for child in node.children:
        _check_nodes(child, node, catalog)
