-- The users of integration/services/mariadb_cluster.py, for docker-compose.yml's mariadb
-- (run once by the image's entrypoint, after it created the database and the user eos).
-- eos: only the sink's table privileges on eos.* (the image grants it ALL there; CREATE
-- TEMPORARY TABLES: the upsert's staging table); XA
-- RECOVER, XA COMMIT and XA ROLLBACK need no privilege on MariaDB 10.11.
REVOKE ALL PRIVILEGES, GRANT OPTION FROM 'eos'@'%';
GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, CREATE TEMPORARY TABLES ON eos.* TO 'eos'@'%';
-- eos_tls: the same, TLS only. The 10.11 image has no server certificate, so this user
-- cannot log in here: the TLS tests need `scripts/services` (or certificates mounted and
-- --ssl-cert/--ssl-key/--ssl-ca added to the command).
CREATE USER IF NOT EXISTS 'eos_tls'@'%' IDENTIFIED BY 'eos-tls-mariadb-pass-3Jd' REQUIRE SSL;
GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, CREATE TEMPORARY TABLES ON eos.* TO 'eos_tls'@'%';
-- The databases the docs' tests create for a page each (eos_docs_<tag>), and drop after.
GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, CREATE TEMPORARY TABLES ON `eos\_docs\_%`.* TO 'eos'@'%';
