"""KafkaSink against a real Kafka broker."""
