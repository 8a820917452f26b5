"""MariaDB and MySQL: exactly-once through XA prepared transactions (issue 54)."""
