"""The sinks on the secured listeners: PostgreSQL over TLS, Kafka over SASL_SSL."""
