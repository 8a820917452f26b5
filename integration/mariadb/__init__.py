"""MariaDB: the test service an exactly-once MariaDB sink will rely on."""
