"""What is secret in a Kafka client config, and the one function that masks it.

The one place that decides it for every Kafka setting the library sees (the sink's
``config``, the operator CLI's ``--kafka-config``, Spark's ``kafka.``-prefixed options):

- librdkafka's sensitive properties (its ``CONFIGURATION.md``): ``sasl.password``,
  ``sasl.oauthbearer.client.secret`` (and its alias
  ``sasl.oauthbearer.client.credentials.client.secret``), ``sasl.oauthbearer.config``
  (the unsecured-JWT and metadata settings), ``sasl.oauthbearer.assertion.private.key.pem``
  and ``...passphrase``, ``ssl.key.password``, ``ssl.key.pem``, ``ssl_key`` and
  ``ssl.keystore.password``;
- the Java client's, as Spark's Kafka source and sink take them (``kafka.`` prefix
  optional): ``sasl.jaas.config``, ``ssl.truststore.password``, ``ssl.keystore.password``,
  ``ssl.key.password``, ``ssl.keystore.key``;
- any other key naming a password, passphrase, secret, token, JAAS config or private key
  (unless it ends in ``.url``, ``.location``, ``.file``, ``.id``...), and every inline
  PEM (``*.pem``: a certificate is no secret, but its text is of no use in a message).

Paths (``ssl.key.location``, ``ssl.keystore.location``, ``sasl.kerberos.keytab``) are not
secrets: the files' contents never enter a string. Usernames and client ids show.

:func:`redact_text` masks, in any text, the secret values it is given (those of at least
4 characters: masking a shorter one would garble the rest of a message) and the value of
any secret key written as ``key=value``, ``key: value`` or ``"key": "value"``.

Example::

    >>> is_secret_key("kafka.sasl.jaas.config"), is_secret_key("sasl.username")
    (True, False)
    >>> redact_text("auth failed: sasl.password=hunter2 for user app", [])
    'auth failed: sasl.password=*** for user app'
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["MASK", "SECRET_KEYS", "is_secret_key", "redact_text"]

MASK = "***"
#: Shortest bare value masked in free text.
MIN_MASKED = 4
#: The secret keys by name (without Spark's ``kafka.`` prefix), see the module docstring.
SECRET_KEYS = frozenset({
    # librdkafka: the properties CONFIGURATION.md lists as sensitive
    "sasl.password",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl_key",
    "ssl.keystore.password",
    # the Java client (Spark's Kafka source and sink, as kafka.<key>)
    "sasl.jaas.config",
    "ssl.truststore.password",
    "ssl.keystore.key",
})
_NAME = r"[A-Za-z0-9_.-]*"
#: Last parts of a name that say it is no secret, whatever words come before: a path, a
#: URL, an id (``sasl.oauthbearer.token.endpoint.url``, ``...private.key.file``).
_NOT_SECRET_ENDS = ("url", "location", "file", "id", "type", "method", "algorithm")
#: A secret key's name: one of :data:`SECRET_KEYS`, or a name holding a secret word, or
#: an inline PEM; Spark's ``kafka.`` prefix optional.
_SECRET_NAME = (
    r"(?:kafka\.)?(?:"
    + "|".join(re.escape(k) for k in sorted(SECRET_KEYS, key=len, reverse=True))
    + rf"|{_NAME}(?:password|passwd|passphrase|secret|token|jaas|private){_NAME}"
    + "".join(rf"(?<!\.{end})" for end in _NOT_SECRET_ENDS)
    + rf"|{_NAME}\.pem)"
)
_SECRET_KEY = re.compile(_SECRET_NAME, re.IGNORECASE)
#: A secret key's value in text: ``key=value``, ``key: value``, ``"key": "value"``.
_KEY_VALUE = re.compile(
    rf"""(?<![A-Za-z0-9_.-])(["']?)({_SECRET_NAME})\1(\s*[=:]\s*)"""
    r"""("(?:\\.|[^"\\])*"?|'(?:\\.|[^'\\])*'?|[^\s,;}]+)""",
    re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    """Whether a Kafka client setting's value is a secret (see the module docstring)."""
    return bool(_SECRET_KEY.fullmatch(key.strip()))


def _mask_pair(match: re.Match[str]) -> str:
    quote, key, sep, value = match.groups()
    around = value[0] if value[:1] in ("'", '"') else ""
    return f"{quote}{key}{quote}{sep}{around}{MASK}{around}"


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret masked (see the module docstring)."""
    if isinstance(secrets, str):  # one value, not its characters
        secrets = (secrets,)
    # The bare values first: a key=value form below may end a value at its first space.
    for secret in sorted({s for s in secrets if s and len(s) >= MIN_MASKED}, key=len,
                         reverse=True):  # a value inside another: the longest first
        text = text.replace(secret, MASK)
    return _KEY_VALUE.sub(_mask_pair, text)
