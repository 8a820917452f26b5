"""What is secret in a libpq connection string, and the one function that masks it.

A secret is the value of a keyword libpq itself hides (``dispchar`` ``*``: ``password``,
``sslpassword``, ``oauth_client_secret`` with libpq 18) or one that authenticates as
well as a password does (``scram_client_key``, ``scram_server_key``); a newer libpq's
hidden keywords count without a change here. The value of a setting inside ``options``
whose name says password, secret, token or key (``-c app.secret=...``) is masked too;
the rest of ``options`` (``-c search_path=...``) stays readable. Paths (``sslkey``,
``passfile``, ``sslcert``) are not secrets: the files' contents never enter a string.

:func:`redact` masks, in any text, every form a user may write these in:

- keyword conninfo, plain or quoted (``password=pw``, ``password = 'p w\\'x'``);
- a URI's userinfo (``postgresql://user:pw@host``) and query parameters
  (``postgresql://host/db?sslpassword=pw``);
- the bare values it is given (those of at least 4 characters: masking a shorter one
  would garble the rest of a message), percent-encoded as in a URI too.

Example::

    >>> redact("postgresql://u:pw1@h/db?sslpassword=keypass123 failed", ["keypass123"])
    'postgresql://u:***@h/db?sslpassword=*** failed'
    >>> redact("host=h sslpassword='a \\\\'b' user=u")
    'host=h sslpassword=*** user=u'
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from urllib.parse import quote

__all__ = ["MASK", "is_secret_keyword", "options_secrets", "redact", "secret_keywords"]

MASK = "***"
#: Shortest bare value masked in free text.
MIN_MASKED = 4
#: Secret keywords whatever the libpq version says (older ones lack some of them).
_KNOWN = frozenset({
    "password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key",
})
#: A setting inside ``options`` whose value is masked: ``-c NAME=VALUE`` or ``--NAME=VALUE``.
_OPTION_SETTING = re.compile(
    r"((?:-c\s*|--)([A-Za-z0-9_.-]+)=)((?:\\.|[^\s\\])*)")
_SECRET_SETTING = re.compile(r"password|passwd|secret|token|key", re.IGNORECASE)
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*:)[^@\s/?#]*@")


@functools.cache
def secret_keywords() -> frozenset[str]:
    """The libpq keywords whose values are secrets (see the module docstring)."""
    from psycopg import pq

    hidden = {o.keyword.decode() for o in pq.Conninfo.get_defaults() if o.dispchar == b"*"}
    return _KNOWN | hidden


def is_secret_keyword(keyword: str) -> bool:
    """Whether a libpq keyword's value is a secret."""
    return keyword.lower() in secret_keywords()


def options_secrets(options: str) -> list[str]:
    """The values of the secret-looking settings inside a libpq ``options`` value."""
    return [m.group(3) for m in _OPTION_SETTING.finditer(options)
            if _SECRET_SETTING.search(m.group(2)) and m.group(3)]


def mask_options(options: str) -> str:
    """``options`` with the values of its secret-looking settings masked."""
    return _OPTION_SETTING.sub(
        lambda m: m.group(1) + MASK if _SECRET_SETTING.search(m.group(2)) else m.group(0),
        options)


@functools.cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    words = "|".join(sorted(map(re.escape, secret_keywords()), key=len, reverse=True))
    # keyword=value: not right after '?' or '&' (a URI's query, below), quoted or not.
    keyword = re.compile(
        rf"(?<![\w?&.])({words})(\s*=\s*)('(?:\\.|[^'\\])*'?|(?:\\.|[^\s\\])+)",
        re.IGNORECASE)
    query = re.compile(rf"([?&](?:{words})=)[^&#\s]*", re.IGNORECASE)
    return keyword, query


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret of a connection string masked (see the module docstring).

    ``secrets``: the bare values to mask wherever they appear (a conninfo's
    :attr:`~connectors.postgres.Conninfo.secrets`).
    """
    if isinstance(secrets, str):  # one value, not its characters
        secrets = (secrets,)
    # The bare values first: a keyword form below may end a value at its first space.
    values = {v for s in secrets if s and len(s) >= MIN_MASKED for v in (s, quote(s, safe=""))}
    for value in sorted(values, key=len, reverse=True):  # a value inside another: longest first
        text = text.replace(value, MASK)
    keyword, query = _patterns()
    text = query.sub(rf"\1{MASK}", text)
    text = keyword.sub(rf"\1\2{MASK}", text)
    text = _USERINFO.sub(rf"\1{MASK}@", text)
    return mask_options(text)

